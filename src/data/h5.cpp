#include "h5.hpp"

#include <filesystem>
#include <mutex>

namespace ringtrain::data::h5 {
namespace {

// The innermost (most specific) message of HDF5's current error stack.
herr_t take_innermost(unsigned n, const H5E_error2_t* e, void* out) {
  auto* s = static_cast<std::string*>(out);
  if (n == 0 && e->desc) *s = e->desc;
  return 0;
}

std::string hdf5_reason() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, take_innermost, &s);
  H5Eclear2(H5E_DEFAULT);
  return s.empty() ? "no HDF5 detail" : s;
}

}  // namespace

void Handle::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    default: break;
  }
  id_ = H5I_INVALID_HID;
}

void silence_errors() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
  // H5Eset_auto is per thread in thread-safe builds; repeat it cheaply for this thread.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

hid_t check_id(hid_t id, const std::string& file, const std::string& what) {
  if (id < 0) RT_FAIL(file, ": ", what, " failed (HDF5: ", hdf5_reason(), ")");
  return id;
}

void check(herr_t rc, const std::string& file, const std::string& what) {
  if (rc < 0) RT_FAIL(file, ": ", what, " failed (HDF5: ", hdf5_reason(), ")");
}

Handle open_file(const std::string& path, hid_t fapl) {
  silence_errors();
  std::error_code ec;
  RT_CHECK(std::filesystem::exists(path, ec), path, ": file not found");
  RT_CHECK(std::filesystem::is_regular_file(path, ec), path, ": not a regular file");
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  if (f < 0)
    RT_FAIL(path, ": cannot open as HDF5: not an HDF5 file, or truncated or corrupt (HDF5: ", hdf5_reason(), ")");
  return Handle(f);
}

Handle create_file(const std::string& path) {
  silence_errors();
  return Handle(check_id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), path, "creating the file"));
}

bool has_attr(hid_t obj, const char* name) { return H5Aexists(obj, name) > 0; }

namespace {
void write_attr(hid_t obj, const char* name, hid_t type, hid_t space, const void* buf, const std::string& file) {
  if (has_attr(obj, name)) H5Adelete(obj, name);
  Handle a(check_id(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), file,
                    cat("creating attribute '", name, "'")));
  check(H5Awrite(a, type, buf), file, cat("writing attribute '", name, "'"));
}

Handle open_attr(hid_t obj, const char* name, const std::string& file) {
  RT_CHECK(has_attr(obj, name), file, ": attribute '", name, "' is missing (not a ringtrain data file?)");
  return Handle(check_id(H5Aopen(obj, name, H5P_DEFAULT), file, cat("opening attribute '", name, "'")));
}

hssize_t attr_points(hid_t a) {
  Handle sp(H5Aget_space(a));
  return H5Sget_simple_extent_npoints(sp);
}

Handle vlen_str_type() {
  Handle t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}
}  // namespace

void write_attr_i64(hid_t obj, const char* name, std::int64_t v, const std::string& file) {
  Handle sp(H5Screate(H5S_SCALAR));
  write_attr(obj, name, H5T_NATIVE_INT64, sp, &v, file);
}

void write_attr_f64s(hid_t obj, const char* name, const std::vector<double>& v, const std::string& file) {
  hsize_t n = v.size();
  Handle sp(H5Screate_simple(1, &n, nullptr));
  write_attr(obj, name, H5T_NATIVE_DOUBLE, sp, v.data(), file);
}

void write_attr_str(hid_t obj, const char* name, const std::string& v, const std::string& file) {
  Handle t = vlen_str_type();
  Handle sp(H5Screate(H5S_SCALAR));
  const char* p = v.c_str();
  write_attr(obj, name, t, sp, &p, file);
}

void write_attr_strs(hid_t obj, const char* name, const std::vector<std::string>& v, const std::string& file) {
  Handle t = vlen_str_type();
  hsize_t n = v.size();
  Handle sp(n ? H5Screate_simple(1, &n, nullptr) : H5Screate(H5S_NULL));
  std::vector<const char*> ptrs;
  for (auto& s : v) ptrs.push_back(s.c_str());
  write_attr(obj, name, t, sp, ptrs.data(), file);
}

std::int64_t read_attr_i64(hid_t obj, const char* name, const std::string& file) {
  Handle a = open_attr(obj, name, file);
  Handle t(H5Aget_type(a));
  RT_CHECK(H5Tget_class(t) == H5T_INTEGER && attr_points(a) == 1, file, ": attribute '", name,
           "' must be one integer");
  std::int64_t v = 0;
  check(H5Aread(a, H5T_NATIVE_INT64, &v), file, cat("reading attribute '", name, "'"));
  return v;
}

std::vector<double> read_attr_f64s(hid_t obj, const char* name, const std::string& file) {
  Handle a = open_attr(obj, name, file);
  Handle t(H5Aget_type(a));
  RT_CHECK(H5Tget_class(t) == H5T_FLOAT || H5Tget_class(t) == H5T_INTEGER, file, ": attribute '", name,
           "' must be numeric");
  std::vector<double> v(static_cast<std::size_t>(attr_points(a)));
  if (!v.empty()) check(H5Aread(a, H5T_NATIVE_DOUBLE, v.data()), file, cat("reading attribute '", name, "'"));
  return v;
}

std::vector<std::string> read_attr_strs(hid_t obj, const char* name, const std::string& file) {
  Handle a = open_attr(obj, name, file);
  Handle ft(H5Aget_type(a));
  RT_CHECK(H5Tget_class(ft) == H5T_STRING, file, ": attribute '", name, "' must be a string");
  hssize_t n = attr_points(a);
  std::vector<std::string> out;
  if (n <= 0) return out;
  if (H5Tis_variable_str(ft) > 0) {
    Handle t = vlen_str_type();
    H5Tset_cset(t, H5Tget_cset(ft));  // HDF5 will not convert between ASCII and UTF-8
    std::vector<char*> ptrs(static_cast<std::size_t>(n), nullptr);
    check(H5Aread(a, t, ptrs.data()), file, cat("reading attribute '", name, "'"));
    for (char* p : ptrs) out.emplace_back(p ? p : "");
    Handle sp(H5Aget_space(a));
    H5Dvlen_reclaim(t, sp, H5P_DEFAULT, ptrs.data());
  } else {  // fixed-length strings (e.g. written by h5py with numpy 'S' arrays)
    std::size_t len = H5Tget_size(ft);
    std::vector<char> buf(len * static_cast<std::size_t>(n));
    check(H5Aread(a, ft, buf.data()), file, cat("reading attribute '", name, "'"));
    for (hssize_t i = 0; i < n; ++i) {
      std::string s(buf.data() + i * len, len);
      s.erase(s.find_last_not_of('\0') + 1);
      out.push_back(s);
    }
  }
  return out;
}

std::string read_attr_str(hid_t obj, const char* name, const std::string& file) {
  auto v = read_attr_strs(obj, name, file);
  RT_CHECK(v.size() == 1, file, ": attribute '", name, "' must be one string");
  return v[0];
}

std::vector<hsize_t> dims_of(hid_t dset, const std::string& file, const char* name) {
  Handle sp(check_id(H5Dget_space(dset), file, cat("reading the dataspace of /", name)));
  int nd = H5Sget_simple_extent_ndims(sp);
  RT_CHECK(nd >= 0, file, ": dataset /", name, " has no simple dataspace");
  std::vector<hsize_t> d(static_cast<std::size_t>(nd));
  H5Sget_simple_extent_dims(sp, d.data(), nullptr);
  return d;
}

}  // namespace ringtrain::data::h5
