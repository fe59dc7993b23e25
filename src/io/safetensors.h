// Safetensors reading (mmap, single file or sharded through
// model.safetensors.index.json) and writing.
//
// Layout: u64 little-endian header length N, N bytes of JSON mapping tensor
// names to {dtype, shape, data_offsets:[begin,end)} relative to the data
// buffer that follows, plus an optional "__metadata__" object. The reader
// validates everything before handing out a view: header bounds, JSON
// (streamed, no DOM; duplicate names refused),
// dtype names, offsets inside the buffer, no overlaps, byte size equal to
// dtype size x element count, and for sharded checkpoints that every tensor
// of the index is in its shard and no shard holds tensors outside the index.
// Errors name the file and the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"

namespace cm {

// A view of one stored tensor; `data` points into a mapping owned by the file.
struct TensorView {
  std::string name;
  std::string file;  // path of the file that holds it (for error messages)
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
  std::string shape_str() const;  // "[2048, 4096]"
};

// What a safetensors file's bytes hold: its tensors (views into those bytes) and metadata.
struct SafetensorsContents {
  std::map<std::string, TensorView> tensors;
  std::map<std::string, std::string> metadata;
};

// Parses and validates a whole safetensors file held in memory (header length,
// header, data buffer) with a streaming parser (no JSON DOM; the table's cost
// is capped); `source` names the file in errors and in each view's `file`.
// SafetensorsFile runs this on its mapping; fuzz targets on arbitrary bytes.
SafetensorsContents parse_safetensors(const uint8_t* bytes, size_t size, const std::string& source);

// The weight_map of a model.safetensors.index.json text: shard file name ->
// tensor names. Throws cm::Error naming `source` for bad or too deeply nested
// JSON, a missing weight_map, a non-string entry or a shard outside the directory.
std::map<std::string, std::vector<std::string>> parse_safetensors_index(std::string_view json_text,
                                                                        const std::string& source);

// One mmap'd .safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws cm::Error
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorView* find(const std::string& name) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: the shards of model.safetensors.index.json;
// else model.safetensors; else every *.safetensors file of the directory.
class TensorStore {
 public:
  static TensorStore open_dir(const std::string& dir);  // throws cm::Error
  static TensorStore open_file(const std::string& path);

  const TensorView* find(const std::string& name) const;
  const TensorView& get(const std::string& name) const;  // throws naming the tensor
  const std::map<std::string, const TensorView*>& all() const { return index_; }
  size_t total_bytes() const;

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

// A tensor to write: raw little-endian bytes in C order.
struct TensorData {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes a safetensors file (header padded to 8 bytes) through an OutputFile
// (io/output_file.h): a regular file is written to a temporary and renamed only
// when complete, a device or FIFO is written in place, never replaced;
// protect_dirs are directories (the model being read) it must not write into.
void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::vector<std::string>& protect_dirs = {});

TensorData tensor_f32(const std::string& name, std::vector<int64_t> shape, const float* values);

}  // namespace cm
