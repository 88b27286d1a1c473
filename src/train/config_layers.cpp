#include "config_layers.hpp"

#include <charconv>
#include <cmath>
#include <sstream>

#include "ringtrain/core/error.hpp"

namespace ringtrain {
namespace {

LayerDesc parse_entry(const toml::node& n, const std::string& where, const std::string& file);

std::vector<LayerDesc> parse_list(const toml::node& n, const std::string& where, const std::string& file) {
  const toml::array* a = n.as_array();
  RT_CHECK(a != nullptr, file, ": ", where, " must be a list of tables ([[model.layers]] or [{ type = ... }, ...]) "
           "(line ", n.source().begin.line, ")");
  std::vector<LayerDesc> out;
  for (std::size_t i = 0; i < a->size(); ++i) out.push_back(parse_entry((*a)[i], cat(where, "[", i, "]"), file));
  return out;
}

LayerDesc parse_entry(const toml::node& n, const std::string& where, const std::string& file) {
  const toml::table* t = n.as_table();
  RT_CHECK(t != nullptr, file, ": ", where, " must be a table with a 'type' key (line ", n.source().begin.line, ")");
  LayerDesc d;
  const toml::node* type = t->get("type");
  RT_CHECK(type != nullptr && type->is_string(), file, ": ", where, " needs type = \"conv\" | \"linear\" | ... "
           "(a string; line ", n.source().begin.line, ")");
  d.type = *type->value<std::string>();
  for (auto& [k, v] : *t) {
    const std::string key(k.str());
    const auto line = v.source().begin.line;
    if (key == "type") continue;
    if (key == "layers" || key == "shortcut") {
      (key == "layers" ? d.layers : d.shortcut) = parse_list(v, cat(where, ".", key), file);
      continue;
    }
    if (v.is_integer()) d.options.emplace_back(key, v.as_integer()->get());
    else if (v.is_floating_point()) {
      const double x = v.as_floating_point()->get();
      RT_CHECK(std::isfinite(x), file, ": ", where, ".", key, " must be a finite number (line ", line, ")");
      d.options.emplace_back(key, x);
    } else if (v.is_boolean()) d.options.emplace_back(key, v.as_boolean()->get());
    else if (v.is_string()) d.options.emplace_back(key, v.as_string()->get());
    else RT_FAIL(file, ": ", where, ".", key, " must be a number, boolean or string (line ", line, ")");
  }
  return d;
}

std::string float_text(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string value_text(const LayerDesc::Value& v) {
  std::ostringstream os;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) os << toml::value<std::string>(x);
        else if constexpr (std::is_same_v<T, bool>) os << (x ? "true" : "false");
        else if constexpr (std::is_same_v<T, double>) os << float_text(x);
        else os << x;
      },
      v);
  return os.str();
}

std::string inline_list(const std::vector<LayerDesc>& l);

// key = value pairs of one entry, `sep` between them.
std::string body(const LayerDesc& d, const char* sep) {
  std::string s = "type = " + value_text(d.type);
  for (const auto& [k, v] : d.options) s += sep + k + " = " + value_text(v);
  if (!d.layers.empty()) s += std::string(sep) + "layers = " + inline_list(d.layers);
  if (!d.shortcut.empty()) s += std::string(sep) + "shortcut = " + inline_list(d.shortcut);
  return s;
}

std::string inline_list(const std::vector<LayerDesc>& l) {
  std::string s = "[";
  for (std::size_t i = 0; i < l.size(); ++i) s += (i ? ", { " : "{ ") + body(l[i], ", ") + " }";
  return s + "]";
}

}  // namespace

std::vector<LayerDesc> parse_layers_toml(const toml::node& node, const std::string& file) {
  return parse_list(node, "model.layers", file);
}

std::string layers_to_toml(const std::vector<LayerDesc>& layers) {
  std::string s;
  for (const auto& d : layers) s += "\n[[model.layers]]\n" + body(d, "\n") + "\n";
  return s;
}

}  // namespace ringtrain
