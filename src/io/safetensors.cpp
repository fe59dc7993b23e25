#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "io/input_file.h"
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
// Bounds on what a header may describe, so a legal-size header cannot cost
// far more memory than its text: dims per tensor, nesting of ignored values,
// and the estimated bytes of the parsed tensor table (see HeaderParser::cost).
constexpr size_t kMaxRank = 32;
constexpr int kMaxSkipDepth = 32;
constexpr uint64_t kMaxHeaderCost = uint64_t(1) << 30;

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// A tensor name as shown in messages (names come from the file: never print one whole).
std::string show(const std::string& name) { return truncate_text(name, 120); }

struct Entry {
  std::string name, dtype;
  std::vector<uint64_t> shape;
  std::vector<uint64_t> offsets;
  bool has_dtype = false, has_shape = false, has_offsets = false;
};

// Streaming (SAX) parse of the header straight into tensor entries, without a
// JSON DOM: a DOM of a 100 MB header costs about 30x its size. Rejects
// duplicate tensor names and duplicate fields (a DOM keeps the last silently).
struct HeaderParser : nlohmann::json_sax<json> {
  const std::string& path;
  const uint8_t* data;  // the data buffer after the header
  uint64_t data_size;
  std::map<std::string, TensorView>& tensors;
  std::map<std::string, std::string>& metadata;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // data_offsets of every tensor
  Entry cur;            // the entry being read
  uint64_t cost = 0;  // estimated bytes of the parsed table
  // Where we are: 0 outside, 1 in the top object, 2 in an entry or __metadata__, 3 in shape/offsets.
  int level = 0;
  bool in_metadata = false, seen_metadata = false;
  std::string tname, field;  // current tensor name (top-level key), current entry field
  std::set<std::string> fields;
  int skip = 0;  // > 0 while skipping an unknown field's value (its nesting depth)
  bool skip_next = false;  // the next value belongs to an unknown field

  HeaderParser(const std::string& p, const uint8_t* d, uint64_t n, std::map<std::string, TensorView>& t,
               std::map<std::string, std::string>& m)
      : path(p), data(d), data_size(n), tensors(t), metadata(m) {}

  // Checks the finished entry against the data buffer and adds it.
  void add_tensor() {
    const std::string name = show(cur.name);
    TensorView v;
    v.file = path;
    if (!dtype_parse(cur.dtype, &v.dtype))
      fail("{}: tensor '{}': unsupported dtype '{}'", path, name, truncate_text(cur.dtype, 40));
    uint64_t numel = 1;
    for (uint64_t dim : cur.shape) {
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim / 8)
        fail("{}: tensor '{}': shape overflows", path, name);
      numel *= dim;
      v.shape.push_back(int64_t(dim));
    }
    uint64_t b = cur.offsets[0], en = cur.offsets[1];
    if (b > en) fail("{}: tensor '{}': data_offsets [{}, {}) are reversed", path, name, b, en);
    if (en > data_size)
      fail("{}: tensor '{}': data_offsets [{}, {}) lie outside the {}-byte data buffer (truncated file?)", path, name,
           b, en, data_size);
    uint64_t want = numel * dtype_size(v.dtype);
    if (en - b != want)
      fail("{}: tensor '{}': {} bytes stored but {} {} needs {}", path, name, en - b, cur.dtype, v.shape_str(), want);
    v.data = data + b;
    v.nbytes = size_t(en - b);
    v.name = cur.name;
    ranges.emplace_back(b, en);
    tensors.emplace(std::move(cur.name), std::move(v));
  }

  [[noreturn]] void bad(const std::string& what) const {
    if (level >= 2 && !in_metadata) fail("{}: tensor '{}': {}", path, show(tname), what);
    fail("{}: header {}", path, what);
  }
  void charge(uint64_t n) {
    cost += n;
    if (cost > kMaxHeaderCost)
      fail("{}: header describes more than {} MB of tensor table; refusing it", path, kMaxHeaderCost >> 20);
  }
  // A scalar value arrived at the current position.
  bool scalar(const json& v) {
    if (skip_next) return skip_next = false, true;
    if (skip) return true;
    if (level == 0) fail("{}: header is not a JSON object", path);
    if (level == 1) {
      if (tname == "__metadata__") fail("{}: __metadata__ is not an object", path);
      fail("{}: tensor '{}': entry needs dtype, shape and data_offsets", path, show(tname));
    }
    if (level == 2 && in_metadata) {
      if (!v.is_string()) fail("{}: __metadata__ value of '{}' is not a string", path, show(field));
      charge(96 + field.size() + v.get_ref<const std::string&>().size());
      metadata[field] = v.get<std::string>();
      return true;
    }
    Entry& e = cur;
    if (level == 2) {
      if (field == "dtype") {
        if (!v.is_string()) bad("dtype is not a string");
        e.dtype = v.get<std::string>();
        e.has_dtype = true;
      } else if (field == "shape") {
        bad("shape is not an array");
      } else {
        bad("data_offsets must be two non-negative integers");
      }
      return true;
    }
    // level 3: an element of shape or data_offsets
    if (field == "shape") {
      if (!v.is_number_unsigned()) bad("shape entries must be non-negative integers");
      if (e.shape.size() >= kMaxRank) bad(fmt::format("shape has more than {} dimensions", kMaxRank));
      e.shape.push_back(v.get<uint64_t>());
      charge(8);
    } else {
      if (!v.is_number_unsigned() || e.offsets.size() >= 2) bad("data_offsets must be two non-negative integers");
      e.offsets.push_back(v.get<uint64_t>());
    }
    return true;
  }
  bool open(bool object) {
    if (skip_next) {
      skip_next = false;
      skip = 1;
      return true;
    }
    if (skip) {
      if (++skip > kMaxSkipDepth) fail("{}: header nested deeper than {} levels", path, kMaxSkipDepth);
      return true;
    }
    if (level == 0) {
      if (!object) fail("{}: header is not a JSON object", path);
      level = 1;
      return true;
    }
    if (level == 1) {
      if (!object) {
        if (tname == "__metadata__") fail("{}: __metadata__ is not an object", path);
        fail("{}: tensor '{}': entry needs dtype, shape and data_offsets", path, show(tname));
      }
      level = 2;
      fields.clear();
      in_metadata = tname == "__metadata__";
      if (in_metadata) {
        if (seen_metadata) fail("{}: __metadata__ appears twice in the header", path);
        seen_metadata = true;
      } else {
        if (tensors.count(tname)) fail("{}: tensor '{}' appears twice in the header", path, show(tname));
        // map node + TensorView + name twice + file path + shape vector + range
        charge(224 + 2 * tname.size() + path.size());
        cur = Entry();
        cur.name = tname;
      }
      return true;
    }
    if (level == 2 && in_metadata) fail("{}: __metadata__ value of '{}' is not a string", path, show(field));
    if (level == 2 && field == "dtype") bad("dtype is not a string");
    if (level == 2 && object) {
      if (field == "shape") bad("shape is not an array");
      bad("data_offsets must be two non-negative integers");
    }
    if (level == 2) {
      level = 3;
      if (field == "shape") cur.has_shape = true;
      else cur.has_offsets = true;
      return true;
    }
    if (field == "shape") bad("shape entries must be non-negative integers");
    bad("data_offsets must be two non-negative integers");
  }
  bool close() {
    if (skip) {
      --skip;
      return true;
    }
    if (level == 2 && !in_metadata) {
      if (!cur.has_dtype || !cur.has_shape || !cur.has_offsets) bad("entry needs dtype, shape and data_offsets");
      if (cur.offsets.size() != 2) bad("data_offsets must be two non-negative integers");
      add_tensor();
    }
    if (level == 2) in_metadata = false;
    --level;
    return true;
  }

  bool null() override { return scalar(json()); }
  bool boolean(bool v) override { return scalar(json(v)); }
  bool number_integer(json::number_integer_t v) override { return scalar(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) override { return scalar(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) override { return scalar(json(v)); }
  bool string(json::string_t& v) override { return scalar(json(std::move(v))); }
  bool binary(json::binary_t&) override { return scalar(json()); }
  bool start_object(std::size_t) override { return open(true); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(json::string_t& k) override {
    if (skip) return true;
    if (level == 1) {
      tname = std::move(k);
    } else if (in_metadata) {
      if (metadata.count(k)) fail("{}: __metadata__ key '{}' appears twice", path, show(k));
      field = std::move(k);
    } else {
      if (!fields.insert(k).second) bad(fmt::format("field '{}' appears twice", show(k)));
      field = std::move(k);
      // Unknown fields are ignored (as other readers do); their value is skipped.
      if (field != "dtype" && field != "shape" && field != "data_offsets") skip_next = true;
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    fail("{}: header is not valid JSON: {}", path, truncate_text(ex.what(), 200));
  }
};

}  // namespace

SafetensorsContents parse_safetensors(const uint8_t* base, size_t size, const std::string& path) {
  if (size < 8) fail("{}: truncated safetensors file ({} bytes, no header length)", path, size);
  SafetensorsContents out;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(base[i]) << (8 * i);
  if (n > kMaxHeader) fail("{}: header length {} is over the 100 MB limit", path, n);
  if (n > size - 8) fail("{}: header length {} runs past the end of the file ({} bytes)", path, n, size);
  const uint8_t* data = base + 8 + n;
  HeaderParser h(path, data, size - 8 - n, out.tensors, out.metadata);
  json::sax_parse(base + 8, base + 8 + n, &h);
  std::vector<std::pair<uint64_t, uint64_t>>& ranges = h.ranges;
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      std::string a, b2;
      for (auto& [nm, t] : out.tensors) {
        uint64_t o = uint64_t(t.data - data);
        if (o == ranges[i - 1].first && a.empty()) a = nm;
        else if (o == ranges[i].first) b2 = nm;
      }
      fail("{}: tensors '{}' and '{}' overlap in the data buffer", path, show(a), show(b2));
    }
  }
  return out;
}

std::map<std::string, std::vector<std::string>> parse_safetensors_index(std::string_view text,
                                                                        const std::string& source) {
  json j = parse_json(text, source);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail("{}: missing the weight_map object", source);
  std::map<std::string, std::vector<std::string>> by_file;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) fail("{}: weight_map entry '{}' is not a file name", source, show(it.key()));
    std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      fail("{}: weight_map entry '{}' names a path outside the directory: '{}'", source, show(it.key()), show(file));
    by_file[file].push_back(it.key());
  }
  return by_file;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: a FIFO given as a checkpoint file must not wait for a writer.
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail("{}: cannot stat: {}", path, std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail("{}: is a directory, not a safetensors file", path);
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
    const std::map<std::string, std::vector<std::string>> by_file =
        parse_safetensors_index(read_regular_file(index.string(), kMaxConfigBytes), index.string());
    for (auto& [file, names] : by_file) {
      fs::path p = fs::path(dir) / file;
      if (!fs::exists(p)) fail("{}: shard '{}' named by the index does not exist", index.string(), p.string());
      auto f = std::make_shared<SafetensorsFile>(p.string());
      std::set<std::string> expected(names.begin(), names.end());
      for (const auto& n : names) {
        const TensorView* v = f->find(n);
        if (!v) fail("{}: tensor '{}' is listed in the index but not stored in this shard", p.string(), show(n));
        s.index_[n] = v;
      }
      for (auto& [n, v] : f->tensors())
        if (!expected.count(n))
          fail("{}: tensor '{}' is stored in this shard but not listed in the index", p.string(), show(n));
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
