#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "io/output_file.h"

namespace cm {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {
// The reference implementation refuses headers over 100 MB.
constexpr uint64_t kMaxHeader = 100u << 20;

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

SafetensorsContents parse_safetensors(const uint8_t* base, size_t size, const std::string& path) {
  if (size < 8) fail("{}: truncated safetensors file ({} bytes, no header length)", path, size);
  SafetensorsContents out;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(base[i]) << (8 * i);
  if (n > kMaxHeader) fail("{}: header length {} is over the 100 MB limit", path, n);
  if (n > size - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes)", path, n, size);
  json h;
  try {
    h = json::parse(base + 8, base + 8 + n);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", path, e.what());
  }
  if (!h.is_object()) fail("{}: header is not a JSON object", path);
  const uint8_t* data = base + 8 + n;
  const uint64_t data_size = size - 8 - n;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) fail("{}: __metadata__ is not an object", path);
      for (auto m2 = e.begin(); m2 != e.end(); ++m2) {
        if (!m2.value().is_string()) fail("{}: __metadata__ value of '{}' is not a string", path, m2.key());
        out.metadata[m2.key()] = m2.value().get<std::string>();
      }
      continue;
    }
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      fail("{}: tensor '{}': entry needs dtype, shape and data_offsets", path, name);
    TensorView v;
    v.name = name;
    v.file = path;
    if (!e["dtype"].is_string()) fail("{}: tensor '{}': dtype is not a string", path, name);
    std::string dt = e["dtype"].get<std::string>();
    if (!dtype_parse(dt, &v.dtype)) fail("{}: tensor '{}': unsupported dtype '{}'", path, name, dt);
    if (!e["shape"].is_array()) fail("{}: tensor '{}': shape is not an array", path, name);
    uint64_t numel = 1;
    for (const json& d : e["shape"]) {
      if (!d.is_number_unsigned()) fail("{}: tensor '{}': shape entries must be non-negative integers", path, name);
      uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim / 8)
        fail("{}: tensor '{}': shape {} overflows", path, name, e["shape"].dump());
      numel *= dim;
      v.shape.push_back(int64_t(dim));
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail("{}: tensor '{}': data_offsets must be two non-negative integers", path, name);
    uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en) fail("{}: tensor '{}': data_offsets [{}, {}) are reversed", path, name, b, en);
    if (en > data_size)
      fail("{}: tensor '{}': data_offsets [{}, {}) lie outside the {}-byte data buffer (truncated file?)", path,
           name, b, en, data_size);
    uint64_t want = numel * dtype_size(v.dtype);
    if (en - b != want)
      fail("{}: tensor '{}': {} bytes stored but {} {} needs {}", path, name, en - b, dt, v.shape_str(), want);
    v.data = data + b;
    v.nbytes = size_t(en - b);
    ranges.emplace_back(b, en);
    out.tensors.emplace(name, std::move(v));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      std::string a, b2;
      for (auto& [nm, t] : out.tensors) {
        uint64_t o = uint64_t(t.data - data);
        if (o == ranges[i - 1].first && a.empty()) a = nm;
        else if (o == ranges[i].first) b2 = nm;
      }
      fail("{}: tensors '{}' and '{}' overlap in the data buffer", path, a, b2);
    }
  }
  return out;
}

std::map<std::string, std::vector<std::string>> parse_safetensors_index(std::string_view text,
                                                                        const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", source, e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail("{}: missing the weight_map object", source);
  std::map<std::string, std::vector<std::string>> by_file;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) fail("{}: weight_map entry '{}' is not a file name", source, it.key());
    std::string file = it.value().get<std::string>();
    if (file.find('/') != std::string::npos || file == "..")
      fail("{}: weight_map entry '{}' names a path outside the directory: '{}'", source, it.key(), file);
    by_file[file].push_back(it.key());
  }
  return by_file;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail("{}: cannot stat: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("{}: not a regular file", path);
  size_t size = size_t(st.st_size);
  if (size < 8) fail("{}: truncated safetensors file ({} bytes, no header length)", path, size);
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (m == MAP_FAILED) fail("{}: mmap failed: {}", path, std::strerror(errno));
  map_ = m;
  map_size_ = size;
  try {
    SafetensorsContents c = parse_safetensors(static_cast<const uint8_t*>(m), size, path);
    tensors_ = std::move(c.tensors);
    metadata_ = std::move(c.metadata);
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

TensorStore TensorStore::open_file(const std::string& path) {
  TensorStore s;
  auto f = std::make_shared<SafetensorsFile>(path);
  for (auto& [name, v] : f->tensors()) s.index_[name] = &v;
  s.files_.push_back(std::move(f));
  return s;
}

TensorStore TensorStore::open_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) fail("{}: not a directory", dir);
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  TensorStore s;
  if (fs::exists(index)) {
    std::string text;
    {
      std::ifstream in(index, std::ios::binary);
      if (!in) fail("{}: cannot open", index.string());
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    std::map<std::string, std::vector<std::string>> by_file = parse_safetensors_index(text, index.string());
    for (auto& [file, names] : by_file) {
      fs::path p = fs::path(dir) / file;
      if (!fs::exists(p)) fail("{}: shard '{}' named by the index does not exist", index.string(), p.string());
      auto f = std::make_shared<SafetensorsFile>(p.string());
      std::set<std::string> expected(names.begin(), names.end());
      for (const auto& n : names) {
        const TensorView* v = f->find(n);
        if (!v) fail("{}: tensor '{}' is listed in the index but not stored in this shard", p.string(), n);
        s.index_[n] = v;
      }
      for (auto& [n, v] : f->tensors())
        if (!expected.count(n)) fail("{}: tensor '{}' is stored in this shard but not listed in the index", p.string(), n);
      s.files_.push_back(std::move(f));
    }
    return s;
  }
  // Without an index, model.safetensors is the checkpoint (as transformers loads it); other
  // *.safetensors files are only read when it does not exist.
  std::vector<fs::path> files;
  if (fs::exists(fs::path(dir) / "model.safetensors")) {
    files.push_back(fs::path(dir) / "model.safetensors");
  } else {
    for (auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) fail("{}: no .safetensors files and no model.safetensors.index.json", dir);
  for (auto& p : files) {
    auto f = std::make_shared<SafetensorsFile>(p.string());
    for (auto& [n, v] : f->tensors()) {
      if (s.index_.count(n)) fail("{}: tensor '{}' is stored in two files (also in {})", p.string(), n, s.index_[n]->file);
      s.index_[n] = &v;
    }
    s.files_.push_back(std::move(f));
  }
  return s;
}

const TensorView* TensorStore::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorView& TensorStore::get(const std::string& name) const {
  const TensorView* v = find(name);
  if (!v) fail("missing tensor '{}'", name);
  return *v;
}

size_t TensorStore::total_bytes() const {
  size_t n = 0;
  for (auto& [k, v] : index_) n += v->nbytes;
  return n;
}

void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::vector<std::string>& protect_dirs) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= uint64_t(d);
    if (numel * dtype_size(t.dtype) != t.bytes.size())
      fail("write {}: tensor '{}' has {} bytes, shape needs {}", path, t.name, t.bytes.size(),
           numel * dtype_size(t.dtype));
    h[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string hs = h.dump();
  while (hs.size() % 8) hs.push_back(' ');
  OutputFile out(path, protect_dirs);
  uint64_t n = hs.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  out.write(len, 8);
  out.write(hs);
  for (const auto& t : tensors) out.write(t.bytes.data(), t.bytes.size());
  out.commit();
}

TensorData tensor_f32(const std::string& name, std::vector<int64_t> shape, const float* values) {
  TensorData t;
  t.name = name;
  t.dtype = DType::F32;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.bytes.resize(size_t(n) * 4);
  std::memcpy(t.bytes.data(), values, t.bytes.size());
  return t;
}

}  // namespace cm
