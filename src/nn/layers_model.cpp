// The `layers` model: top-level layers built from [[model.layers]] entries
// (layers_model.hpp; the keys of each type are in kTypes below and in
// docs/own_model_toml.md). Shapes flow from the data's [C, H, W] through each
// entry's output_shape, so a layer's input size is never written.
//
// Tensor parallelism (parallel.tensor = T): a linear/conv entry with
// tensor = "column" keeps out/T of its outputs on each rank (the activation is
// then split), one with tensor = "row" takes such a split input and
// all-reduces. Between them only per-feature layers may stand (relu, gelu,
// pooling, batchnorm on channels, dropout on features). attention and
// transformer entries split their heads and MLP by themselves; embedding and
// lm_head entries split the vocabulary where T divides it (nn/language.hpp),
// the head then giving this rank's columns of the logits. At T = 1 the
// same file builds the ordinary layers (the pairing is checked all the same).
// The built-in models (models.cpp) are descriptions built here too.
#include "ringtrain/nn/layers_model.hpp"

#include <algorithm>
#include <cmath>

#include "ringtrain/nn/language.hpp"
#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"
#include "ringtrain/nn/transformer.hpp"

namespace ringtrain {
namespace {

// Value kinds: i integer, f number (an integer is accepted), b boolean, s string.
struct KeySpec {
  const char* key;
  char kind;
};
struct TypeSpec {
  const char* type;
  std::vector<KeySpec> keys;  // besides name (every type) and layers/shortcut (residual)
};

const std::vector<TypeSpec>& types() {
  static const std::vector<TypeSpec> t = {
      {"conv", {{"out", 'i'}, {"kernel", 'i'}, {"stride", 'i'}, {"padding", 'i'}, {"bias", 'b'}, {"relu", 'b'},
                {"pool", 'i'}, {"tensor", 's'}, {"init", 's'}}},
      {"linear", {{"out", 'i'}, {"bias", 'b'}, {"relu", 'b'}, {"tensor", 's'}, {"init", 's'}}},
      {"batchnorm", {{"eps", 'f'}, {"momentum", 'f'}}},
      {"layernorm", {{"eps", 'f'}}},
      {"relu", {}},
      {"gelu", {{"approximate", 's'}}},
      {"maxpool", {{"kernel", 'i'}, {"stride", 'i'}, {"padding", 'i'}}},
      {"avgpool", {{"kernel", 'i'}, {"stride", 'i'}, {"padding", 'i'}, {"global", 'b'}}},
      {"dropout", {{"p", 'f'}}},
      {"flatten", {}},
      {"residual", {{"relu", 'b'}}},
      {"attention", {{"heads", 'i'}, {"causal", 'b'}}},
      {"transformer", {{"heads", 'i'}, {"mlp_ratio", 'f'}, {"dropout", 'f'}, {"causal", 'b'}, {"gelu", 's'}, {"eps", 'f'},
                       {"experts", 'i'}, {"top_k", 'i'}, {"aux_loss_coeff", 'f'}, {"capacity_factor", 'f'},
                       {"bias_update_rate", 'f'}}},
      {"patch_embed", {{"patch", 'i'}, {"out", 'i'}}},
      {"token_mean", {}},
      {"embedding", {{"out", 'i'}}},
      {"lm_head", {{"tie", 's'}}},
  };
  return t;
}

std::string type_list() {
  std::string s;
  for (const auto& t : types()) s += std::string(s.empty() ? "" : ", ") + t.type;
  return s;
}

// Sample shape (without the batch) for messages: [64, 7, 7].
std::string sample_str(const Shape& s) { return shape_str(Shape(s.begin() + 1, s.end())); }

// One entry's options, typed, with errors naming where it is.
class Entry {
 public:
  Entry(const LayerDesc& d, std::string where) : d_(d), where_(std::move(where)) {}
  const std::string& where() const { return where_; }
  const LayerDesc& desc() const { return d_; }
  bool has(const char* key) const { return find(key) != nullptr; }
  std::int64_t i(const char* key, std::int64_t def) const {
    const auto* v = find(key);
    return v ? std::get<std::int64_t>(*v) : def;
  }
  double f(const char* key, double def) const {
    const auto* v = find(key);
    if (!v) return def;
    if (const auto* n = std::get_if<std::int64_t>(v)) return double(*n);
    return std::get<double>(*v);
  }
  bool b(const char* key, bool def) const {
    const auto* v = find(key);
    return v ? std::get<bool>(*v) : def;
  }
  std::string s(const char* key, const std::string& def) const {
    const auto* v = find(key);
    return v ? std::get<std::string>(*v) : def;
  }

 private:
  const LayerDesc::Value* find(const char* key) const {
    for (const auto& [k, v] : d_.options)
      if (k == key) return &v;
    return nullptr;
  }
  const LayerDesc& d_;
  std::string where_;
};

void check_list(const std::vector<LayerDesc>& list, const std::string& where);

void check_entry(const LayerDesc& d, const std::string& where) {
  const TypeSpec* spec = nullptr;
  for (const auto& t : types())
    if (d.type == t.type) spec = &t;
  RT_CHECK(spec != nullptr, where, ": unknown type '", d.type, "' (known: ", type_list(), ")");
  const std::string w = cat(where, " (", d.type, ")");
  for (const auto& [k, v] : d.options) {
    if (k == "name") {
      RT_CHECK(std::holds_alternative<std::string>(v) && !std::get<std::string>(v).empty(), w,
               ": key 'name' must be a non-empty string");
      continue;
    }
    const KeySpec* ks = nullptr;
    for (const auto& s : spec->keys)
      if (k == s.key) ks = &s;
    if (!ks) {
      std::string known = "name";
      for (const auto& s : spec->keys) known += std::string(", ") + s.key;
      if (d.type == "residual") known += ", layers, shortcut";
      RT_FAIL(w, ": unknown key '", k, "' (keys of ", d.type, ": ", known, ")");
    }
    const bool ok = ks->kind == 'i'   ? std::holds_alternative<std::int64_t>(v)
                    : ks->kind == 'f' ? (std::holds_alternative<double>(v) || std::holds_alternative<std::int64_t>(v))
                    : ks->kind == 'b' ? std::holds_alternative<bool>(v)
                                      : std::holds_alternative<std::string>(v);
    RT_CHECK(ok, w, ": key '", k, "' must be ",
             ks->kind == 'i' ? "an integer" : ks->kind == 'f' ? "a number" : ks->kind == 'b' ? "true or false"
                                                                                          : "a string");
  }
  const Entry e(d, w);
  for (const char* k : {"out", "kernel", "stride", "heads", "patch"})
    RT_CHECK(!e.has(k) || e.i(k, 1) > 0, w, ": key '", k, "' must be positive, got ", e.i(k, 1));
  for (const char* k : {"padding", "pool"})  // pool = 0: none
    RT_CHECK(e.i(k, 0) >= 0, w, ": key '", k, "' must be >= 0, got ", e.i(k, 0));
  if (e.has("tensor")) {
    const std::string t = e.s("tensor", "");
    RT_CHECK(t == "column" || t == "row", w, ": key 'tensor' must be \"column\" or \"row\", got \"", t, "\"");
  }
  if (e.has("init")) {
    const std::string t = e.s("init", "");
    RT_CHECK(t == "kaiming_normal" || t == "kaiming_uniform" || t == "xavier_uniform" || t == "xavier_normal", w,
             ": key 'init' must be kaiming_normal, kaiming_uniform, xavier_uniform or xavier_normal, got \"", t, "\"");
  }
  for (const char* k : {"p", "dropout"})
    RT_CHECK(!e.has(k) || (e.f(k, 0) >= 0 && e.f(k, 0) < 1), w, ": key '", k, "' must be in [0, 1), got ", e.f(k, 0));
  for (const char* k : {"eps", "mlp_ratio"})
    RT_CHECK(!e.has(k) || e.f(k, 1) > 0, w, ": key '", k, "' must be positive, got ", e.f(k, 1));
  RT_CHECK(!e.has("momentum") || (e.f("momentum", 0) >= 0 && e.f("momentum", 0) <= 1), w,
           ": key 'momentum' must be in [0, 1], got ", e.f("momentum", 0));
  RT_CHECK(!e.has("gelu") || e.s("gelu", "") == "erf" || e.s("gelu", "") == "tanh", w,
           ": key 'gelu' must be erf or tanh, got \"", e.s("gelu", ""), "\"");
  RT_CHECK(!e.has("approximate") || e.s("approximate", "") == "none" || e.s("approximate", "") == "tanh", w,
           ": key 'approximate' must be none or tanh (PyTorch's nn.GELU), got \"", e.s("approximate", ""), "\"");
  RT_CHECK(d.type != "conv" || e.has("out"), w, ": key 'out' (output channels) is required");
  RT_CHECK(d.type != "dropout" || e.has("p"), w, ": key 'p' (drop probability) is required");
  RT_CHECK((d.type != "attention" && d.type != "transformer") || e.has("heads"), w, ": key 'heads' is required");
  RT_CHECK(d.type != "patch_embed" || (e.has("patch") && e.has("out")), w, ": keys 'patch' and 'out' are required");
  RT_CHECK(d.type != "embedding" || e.has("out"), w, ": key 'out' (the embedding width) is required");
  RT_CHECK(d.type != "lm_head" || e.has("tie"), w, ": key 'tie' (the name of the embedding entry whose weight it "
           "uses) is required");
  if (d.type == "residual") {
    RT_CHECK(!d.layers.empty(), w, ": key 'layers' (the block's body, a list of entries) is required");
    check_list(d.layers, where + ".layers");
    check_list(d.shortcut, where + ".shortcut");
  } else {
    RT_CHECK(d.layers.empty() && d.shortcut.empty(), w, ": keys 'layers' and 'shortcut' belong to residual entries");
  }
}

std::string default_name(const LayerDesc& d, std::size_t i) { return cat(d.type, i); }

void check_list(const std::vector<LayerDesc>& list, const std::string& where) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < list.size(); ++i) {
    check_entry(list[i], cat(where, "[", i, "]"));
    const std::string n = Entry(list[i], "").s("name", default_name(list[i], i));
    const auto it = std::find(names.begin(), names.end(), n);
    RT_CHECK(it == names.end(), where, "[", i, "]: name '", n, "' is already used by ", where, "[",
             it - names.begin(), "] (parameters are named after their layer)");
    names.push_back(n);
  }
}

Init init_of(const Entry& e, Init def) {
  const std::string s = e.s("init", "");
  if (s == "kaiming_normal") return Init::kaiming_normal;
  if (s == "kaiming_uniform") return Init::kaiming_uniform;
  if (s == "xavier_uniform") return Init::xavier_uniform;
  if (s == "xavier_normal") return Init::xavier_normal;
  return def;
}

// What every entry of one model is built for.
struct Target {
  const TensorGroup& g;
  std::int64_t classes;  // a linear entry's default `out`
  bool fuse_pool;        // the backend fuses max pooling into the convolution
  std::string root;      // how errors name the top-level list ("model.layers")
  bool sequence = false; // parallel.sequence at g.size > 1: transformer entries split their tokens
  ExpertGroup expert{};  // parallel.expert: transformer entries with experts split them over it
};

// Builds one list of entries (the model, or a residual's body/shortcut),
// tracking the sample shape and whether the activation is split over the
// tensor ranks by a column layer.
class Builder {
 public:
  Builder(const Target& t, Shape shape, std::string parent)
      : t_(t), g_(t.g), shape_(std::move(shape)), parent_(std::move(parent)) {}
  const Shape& shape() const { return shape_; }

  std::vector<LayerPtr> build(const std::vector<LayerDesc>& list, const std::string& where) {
    std::vector<LayerPtr> out;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const LayerDesc& d = list[i];
      const std::string w = cat(where, "[", i, "]");
      std::string name = Entry(d, w).s("name", default_name(d, i));
      if (d.type == "dropout" && !parent_.empty() && !Entry(d, w).has("name")) name = parent_ + "." + name;
      const Entry e(d, cat(w, " (", d.type, " '", name, "')"));
      const std::size_t first = out.size();
      next_ = i + 1 < list.size() ? list[i + 1].type : std::string();
      after_next_ = i + 2 < list.size() ? list[i + 2].type : std::string();
      try {
        add(out, e, name);
        for (std::size_t k = first; k < out.size(); ++k) shape_ = out[k]->output_shape(shape_);
      } catch (const Error& err) {
        const std::string m = err.what();
        if (m.rfind(t_.root, 0) == 0) throw;
        RT_FAIL(e.where(), ": input ", sample_str(shape_), ": ", m);
      }
    }
    RT_CHECK(split_.empty(), split_, " splits its output over the tensor ranks (tensor = \"column\"), but no "
             "tensor = \"row\" entry follows it in ", where, " to join it");
    return out;
  }

 private:
  void need_rank(const Entry& e, std::size_t dims, const char* what) const {
    RT_CHECK(shape_.size() == dims, e.where(), ": needs ", what, ", but its input is ", sample_str(shape_),
             dims == 2 && shape_.size() == 4 ? " (add a flatten entry before it)" : "");
  }
  void not_split(const Entry& e) const {
    RT_CHECK(split_.empty(), e.where(), ": cannot take the output of ", split_, ", which is split over the tensor "
             "ranks: put a tensor = \"row\" linear/conv entry between them");
  }
  std::int64_t tensor_out(const Entry& e, std::int64_t out) const {
    RT_CHECK(out % g_.size == 0, e.where(), ": key 'out' = ", out, " is not divisible by parallel.tensor = ", g_.size,
             " (tensor = \"column\" splits the outputs over the tensor ranks)");
    return out;
  }
  // The input features/channels of a linear/conv: whole ones for a row layer.
  std::int64_t input_size(const Entry& e, std::int64_t local, const std::string& tensor) {
    if (tensor == "row") {
      RT_CHECK(!split_.empty(), e.where(), ": tensor = \"row\" needs an input split by a tensor = \"column\" entry "
               "before it");
      split_.clear();
      return local * g_.size;
    }
    not_split(e);
    if (tensor == "column") split_ = e.where();
    return local;
  }

  void add(std::vector<LayerPtr>& L, const Entry& e, const std::string& name) {
    const std::string& t = e.desc().type;
    const TensorGroup& g = g_;
    const bool tp = g.size > 1;
    const std::string tensor = e.s("tensor", "");
    const TensorSplit split = tensor == "column" ? TensorSplit::column
                              : tensor == "row"  ? TensorSplit::row
                                                 : TensorSplit::none;
    if (t == "linear") {
      RT_CHECK(shape_.size() == 2 || shape_.size() == 3, e.where(), ": needs [features] or tokens [T, D], but its "
               "input is ", sample_str(shape_), shape_.size() == 4 ? " (add a flatten entry before it)" : "");
      const bool relu = e.b("relu", false);
      const std::int64_t out = e.i("out", t_.classes);
      if (tensor == "column") tensor_out(e, out);
      LinearSpec s{input_size(e, shape_.back(), tensor), out, e.b("bias", true), relu};
      L.push_back(split_layer(name, s, init_of(e, relu ? Init::kaiming_normal : Init::xavier_uniform), split, g));
    } else if (t == "conv") {
      need_rank(e, 4, "images [C, H, W]");
      const std::int64_t k = e.i("kernel", 3), st = e.i("stride", 1), pad = e.i("padding", 0), pool = e.i("pool", 0);
      Conv2dSpec s = Conv2dSpec::square(input_size(e, shape_[1], tensor), e.i("out", 0), k, st, e.b("bias", true));
      s.pad_h = s.pad_w = pad;
      s.fuse_relu = e.b("relu", false);
      s.pool.kernel_h = s.pool.kernel_w = s.pool.stride_h = s.pool.stride_w = std::max<std::int64_t>(pool, 1);
      // The row layer pools after its reduction itself; others fuse where the backend can.
      s.fuse_pool = pool > 0 && (t_.fuse_pool || (tp && tensor == "row"));
      if (tensor == "column") tensor_out(e, s.out_channels);
      L.push_back(split_layer(name, s, init_of(e, Init::kaiming_normal), split, g));
      if (pool > 0 && !s.fuse_pool) L.push_back(std::make_unique<Pool2d>(name + "_pool", s.pool));
    } else if (t == "batchnorm") {
      need_rank(e, 4, "images [C, H, W]");
      BatchNormSpec s;
      s.eps = e.f("eps", s.eps);
      s.momentum = e.f("momentum", s.momentum);
      s.channels = shape_[1] * (split_.empty() ? 1 : g.size);
      if (!split_.empty() && tp) L.push_back(std::make_unique<ChannelParallelBatchNorm2d>(name, s, g));
      else L.push_back(std::make_unique<BatchNorm2d>(name, s));
    } else if (t == "layernorm") {
      not_split(e);
      RT_CHECK(shape_.size() >= 2, e.where(), ": needs [features] or tokens [T, D], but its input is ",
               sample_str(shape_));
      L.push_back(std::make_unique<LayerNorm>(name, shape_.back(), e.f("eps", 1e-5)));
    } else if (t == "relu" || t == "gelu") {
      L.push_back(std::make_unique<Activation>(name, t == "relu"                          ? Eltwise::relu
                                                     : e.s("approximate", "none") == "tanh" ? Eltwise::gelu_tanh
                                                                                            : Eltwise::gelu));
    } else if (t == "maxpool" || t == "avgpool") {
      need_rank(e, 4, "images [C, H, W]");
      Pool2dSpec s;
      s.kind = t == "maxpool" ? PoolKind::max : PoolKind::avg;
      s.kernel_h = s.kernel_w = e.i("kernel", 2);
      s.stride_h = s.stride_w = e.i("stride", s.kernel_h);
      s.pad_h = s.pad_w = e.i("padding", 0);
      const bool global = e.b("global", false);
      RT_CHECK(global || (shape_[2] + 2 * s.pad_h >= s.kernel_h && shape_[3] + 2 * s.pad_w >= s.kernel_w),
               e.where(), ": key 'kernel' = ", s.kernel_h, " is larger than its input ", sample_str(shape_));
      L.push_back(std::make_unique<Pool2d>(name, s, global));
    } else if (t == "dropout") {
      auto d = std::make_unique<Dropout>(name, e.f("p", 0));
      if (seq_) d->shard_tokens(g.size, g.rank);  // between a scattering embedding and its transformer
      if (!split_.empty()) {
        RT_CHECK(shape_.size() != 4, e.where(), ": dropout on the channels of a tensor = \"column\" conv is not "
                 "supported: put it after the tensor = \"row\" entry");
        if (tp) d->shard_features(g.size, g.rank);
      }
      L.push_back(std::move(d));
    } else if (t == "flatten") {
      not_split(e);
      L.push_back(std::make_unique<Flatten>(name));
    } else if (t == "residual") {
      add_residual(L, e, name);
    } else if (t == "attention" || t == "transformer") {
      not_split(e);
      need_rank(e, 3, "tokens [T, D] (a patch_embed entry makes them)");
      const std::int64_t dim = shape_[2], heads = e.i("heads", 1);
      RT_CHECK(dim % heads == 0, e.where(), ": key 'heads' = ", heads, " does not divide the token width ", dim,
               " of its input ", sample_str(shape_));
      RT_CHECK(heads % g.size == 0, e.where(), ": key 'heads' = ", heads, " is not divisible by parallel.tensor = ",
               g.size, " (heads are split over the tensor ranks)");
      if (t == "attention") {
        L.push_back(multi_head_attention(name, dim, heads, g, e.b("causal", false)));
        return;
      }
      TransformerBlockSpec s;
      if (t_.sequence) {  // a run of transformer entries passes token shards from one to the next
        s.sequence = true;
        s.seq_first = !seq_;
        s.seq_last = next_ != "transformer";
        if (s.seq_first) seq_shard_shape(shape_, g);  // the sequence length must divide: named errors
        seq_ = !s.seq_last;
      }
      s.dim = dim;
      s.heads = heads;
      s.mlp_ratio = e.f("mlp_ratio", 4.0);
      s.dropout = e.f("dropout", 0.0);
      s.causal = e.b("causal", false);
      s.gelu = e.s("gelu", "erf") == "tanh" ? Eltwise::gelu_tanh : Eltwise::gelu;
      s.eps = e.f("eps", s.eps);
      s.moe.experts = static_cast<int>(e.i("experts", 0));  // mixture of experts (nn/moe.hpp); 0: dense
      s.moe.top_k = static_cast<int>(e.i("top_k", 2));
      s.moe.aux_loss_coeff = e.f("aux_loss_coeff", 0.01);
      s.moe.capacity_factor = e.f("capacity_factor", 0.0);
      s.moe.bias_update_rate = e.f("bias_update_rate", 0.0);
      s.expert = t_.expert;
      if (s.moe.experts > 0)
        RT_CHECK(s.moe.top_k >= 1 && s.moe.top_k <= s.moe.experts && s.moe.experts % t_.expert.size == 0,
                 e.where(), ": key 'experts' = ", s.moe.experts, " must be >= key 'top_k' = ", s.moe.top_k,
                 " >= 1 and divisible by parallel.expert = ", t_.expert.size);
      const auto hidden = static_cast<std::int64_t>(std::llround(double(dim) * s.mlp_ratio));
      RT_CHECK(hidden > 0 && hidden % g.size == 0, e.where(), ": key 'mlp_ratio' = ", s.mlp_ratio, " gives ", hidden,
               " hidden units for width ", dim, ", which must be positive and divisible by parallel.tensor = ", g.size);
      L.push_back(transformer_block(name, s, g));
    } else if (t == "patch_embed") {
      not_split(e);
      need_rank(e, 4, "images [C, H, W]");
      const std::int64_t p = e.i("patch", 1);
      RT_CHECK(shape_[2] % p == 0 && shape_[3] % p == 0, e.where(), ": key 'patch' = ", p, " does not divide its "
               "input ", sample_str(shape_));
      L.push_back(std::make_unique<PatchEmbed>(name, shape_[1], shape_[2], shape_[3], p, e.i("out", 1)));
    } else if (t == "embedding") {
      not_split(e);
      RT_CHECK(shape_.size() == 2, e.where(), ": needs token ids [T] (token data, data.seq_len), but its input is ",
               sample_str(shape_));
      RT_CHECK(t_.classes > 1, e.where(), ": the data gives no vocabulary");
      // Vocabulary-parallel where the tensor ranks divide the vocabulary (language.hpp); else replicated.
      const bool split = tp && t_.classes % g.size == 0;
      auto l = std::make_unique<TokenEmbedding>(name, t_.classes, shape_[1], e.i("out", 1), split ? g : TensorGroup{});
      // Sequence parallelism: a split embedding right before transformer entries (a dropout between
      // them splits its mask alike) reduce-scatters to their token shards instead of all-reducing.
      if (split && t_.sequence &&
          (next_ == "transformer" || (next_ == "dropout" && after_next_ == "transformer"))) {
        seq_shard_shape(shape_, g);  // the sequence length must divide: named errors
        l->scatter_tokens();
        seq_ = true;
      }
      embeddings_.push_back(l.get());
      L.push_back(std::move(l));
    } else if (t == "lm_head") {
      not_split(e);
      const std::string tie = e.s("tie", "");
      TokenEmbedding* emb = nullptr;
      for (auto* x : embeddings_)
        if (x->name() == tie) emb = x;
      RT_CHECK(emb != nullptr, e.where(), ": key 'tie' = '", tie, "' names no embedding entry before it in this list");
      need_rank(e, 3, "tokens [T, D]");
      RT_CHECK(shape_[2] == emb->dim(), e.where(), ": its input has width ", shape_[2], " but the tied embedding '",
               tie, "' has width ", emb->dim());
      emb->tie_to_head();
      L.push_back(std::make_unique<LmHead>(name, tie, emb->vocab(), emb->dim(), emb->group()));
    } else if (t == "token_mean") {
      not_split(e);
      need_rank(e, 3, "tokens [T, D]");
      L.push_back(std::make_unique<TokenMean>(name));
    } else {
      RT_FAIL(e.where(), ": unknown type '", t, "' (known: ", type_list(), ")");
    }
  }

  // y = relu?(body(x) + shortcut(x)); both branches see this entry's input.
  void add_residual(std::vector<LayerPtr>& L, const Entry& e, const std::string& name) {
    not_split(e);
    const std::string w = e.where().substr(0, e.where().find(' '));
    Builder body(t_, shape_, parent_.empty() ? name : parent_ + "." + name);
    Builder shortcut(t_, shape_, parent_.empty() ? name : parent_ + "." + name);
    auto b = body.build(e.desc().layers, w + ".layers");
    auto s = shortcut.build(e.desc().shortcut, w + ".shortcut");
    RT_CHECK(body.shape() == shortcut.shape(), e.where(), ": its layers give ", sample_str(body.shape()), " but ",
             e.desc().shortcut.empty() ? "the identity shortcut gives its input " : "its shortcut gives ",
             sample_str(shortcut.shape()), " (they are added)");
    L.push_back(std::make_unique<Residual>(name, std::move(b), std::move(s), e.b("relu", false)));
  }

  const Target& t_;
  const TensorGroup& g_;
  Shape shape_;         // [1, ...]: one sample
  std::string parent_;  // enclosing residual's name (dropout streams are keyed by layer name)
  std::string split_;   // the column entry whose split output is pending ("" = not split)
  std::string next_;    // the type of the entry after the one being added ("" = none)
  std::string after_next_;  // and of the one after that
  bool seq_ = false;    // the tokens are split over the tensor ranks (inside a run of transformer entries)
  std::vector<TokenEmbedding*> embeddings_;  // built so far, for lm_head's tie (owned by the output list)
};

}  // namespace

void check_layer_descs(const std::vector<LayerDesc>& layers) { check_list(layers, "model.layers"); }

std::vector<LayerPtr> build_described_layers(const std::vector<LayerDesc>& descs, const ModelConfig& c,
                                             bool fuse_pool, const std::string& where) {
  check_list(descs, where);
  const Target t{c.tensor, c.classes, fuse_pool, where, c.sequence && c.tensor.size > 1, c.expert};
  Builder b(t, model_input_shape(c, 1), "");
  auto L = b.build(descs, where);
  if (c.seq_len > 0) {
    // A vocabulary-parallel head gives this rank's columns only (language.hpp).
    auto* head = L.empty() ? nullptr : dynamic_cast<const LmHead*>(L.back().get());
    const std::int64_t parts = head && head->vocab_group() ? head->vocab_group()->size : 1;
    RT_CHECK(b.shape() == (Shape{1, c.seq_len, c.classes / parts}), where, ": the last entry's output is ",
             sample_str(b.shape()), ", but the loss needs [", c.seq_len, ", ", c.classes / parts, "] (one score per "
             "token of the vocabulary", parts > 1 ? " slice of this tensor rank" : "", " at each of data.seq_len "
             "positions)");
    return L;
  }
  RT_CHECK(b.shape().size() == 2 && b.shape()[1] == c.classes, where, ": the last entry's output is ",
           sample_str(b.shape()), ", but the loss needs [", c.classes, "] (one score per class of the data)");
  return L;
}

LayerPtr build_described_layer(const LayerDesc& d, const Shape& sample, const TensorGroup& g, bool fuse_pool) {
  const std::string where = cat(d.type, " entry");
  check_list({d}, where);
  const Target t{g, 0, fuse_pool, where};
  Shape s = {1};
  s.insert(s.end(), sample.begin(), sample.end());
  auto L = Builder(t, s, "").build({d}, where);
  RT_CHECK(L.size() == 1, where, ": builds ", L.size(), " layers, not one");
  return std::move(L[0]);
}

std::vector<LayerPtr> layers_model(const ModelConfig& c, bool fuse_pool) {
  RT_CHECK(!c.layers.empty(), "model 'layers': the [[model.layers]] list is empty");
  return build_described_layers(c.layers, c, fuse_pool, "model.layers");
}

}  // namespace ringtrain
