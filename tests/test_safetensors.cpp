// Safetensors reader: round trip and every malformed-input rejection.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "test_util.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;
using namespace cm;
using cm::test::error_of;

namespace {
std::string tmpdir() {
  auto p = fs::temp_directory_path() / ("cm_st_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream o(path, std::ios::binary);
  uint64_t n = header.size();
  o.write(reinterpret_cast<const char*>(&n), 8);
  o << header << data;
}
}  // namespace

TEST(Safetensors, RoundTrip) {
  std::string d = tmpdir();
  float v[6] = {1, 2, 3, 4, 5, 6};
  std::vector<TensorData> ts = {tensor_f32("a", {2, 3}, v), tensor_f32("b", {3}, v + 3)};
  write_safetensors(d + "/m.safetensors", ts, {{"format", "pt"}});
  SafetensorsFile f(d + "/m.safetensors");
  ASSERT_EQ(f.tensors().size(), 2u);
  const TensorView* a = f.find("a");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->shape_str(), "[2, 3]");
  EXPECT_EQ(a->dtype, DType::F32);
  EXPECT_EQ(reinterpret_cast<const float*>(a->data)[5], 6.0f);
  EXPECT_EQ(reinterpret_cast<const float*>(f.find("b")->data)[0], 4.0f);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  auto s = TensorStore::open_dir(d);
  EXPECT_EQ(s.get("b").numel(), 3);
}

TEST(Safetensors, Truncated) {
  std::string d = tmpdir();
  float v[4] = {1, 2, 3, 4};
  write_safetensors(d + "/m.safetensors", {tensor_f32("w", {4}, v)});
  fs::resize_file(d + "/m.safetensors", fs::file_size(d + "/m.safetensors") - 3);
  std::string e = error_of([&] { SafetensorsFile f(d + "/m.safetensors"); });
  EXPECT_NE(e.find("'w'"), std::string::npos) << e;
  EXPECT_NE(e.find("outside"), std::string::npos) << e;
  std::ofstream(d + "/tiny.safetensors") << "abc";
  EXPECT_NE(error_of([&] { SafetensorsFile f(d + "/tiny.safetensors"); }).find("truncated"), std::string::npos);
}

TEST(Safetensors, LyingHeader) {
  std::string d = tmpdir();
  {
    std::ofstream o(d + "/a.safetensors", std::ios::binary);
    uint64_t n = 1000;
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << "{}";
  }
  EXPECT_NE(error_of([&] { SafetensorsFile f(d + "/a.safetensors"); }).find("past the end"), std::string::npos);
  write_raw(d + "/b.safetensors", "{not json", "");
  EXPECT_NE(error_of([&] { SafetensorsFile f(d + "/b.safetensors"); }).find("not valid JSON"), std::string::npos);
  // size mismatch: F32 [3] needs 12 bytes, offsets give 8
  write_raw(d + "/c.safetensors", R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'));
  std::string e = error_of([&] { SafetensorsFile f(d + "/c.safetensors"); });
  EXPECT_NE(e.find("'x'"), std::string::npos) << e;
  EXPECT_NE(e.find("needs 12"), std::string::npos) << e;
  write_raw(d + "/d.safetensors", R"({"x":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})", std::string(2, '\0'));
  EXPECT_NE(error_of([&] { SafetensorsFile f(d + "/d.safetensors"); }).find("unsupported dtype 'Q4_K'"),
            std::string::npos);
  write_raw(d + "/e.safetensors", R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  EXPECT_NE(error_of([&] { SafetensorsFile f(d + "/e.safetensors"); }).find("'x'"), std::string::npos);
}

TEST(Safetensors, Overlap) {
  std::string d = tmpdir();
  write_raw(d + "/o.safetensors",
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            std::string(12, '\0'));
  std::string e = error_of([&] { SafetensorsFile f(d + "/o.safetensors"); });
  EXPECT_NE(e.find("overlap"), std::string::npos) << e;
  EXPECT_NE(e.find("'a'"), std::string::npos) << e;
  EXPECT_NE(e.find("'b'"), std::string::npos) << e;
}

TEST(Safetensors, ShardedIndex) {
  std::string d = tmpdir();
  float v[2] = {7, 8};
  write_safetensors(d + "/s1.safetensors", {tensor_f32("a", {1}, v)});
  write_safetensors(d + "/s2.safetensors", {tensor_f32("b", {1}, v + 1)});
  std::ofstream(d + "/model.safetensors.index.json")
      << R"({"metadata":{"total_size":8},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})";
  auto s = TensorStore::open_dir(d);
  EXPECT_EQ(reinterpret_cast<const float*>(s.get("b").data)[0], 8.0f);
  EXPECT_NE(error_of([&] { s.get("zzz"); }).find("missing tensor 'zzz'"), std::string::npos);
  // index names a tensor that is not in its shard
  std::ofstream(d + "/model.safetensors.index.json")
      << R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}})";
  std::string e = error_of([&] { TensorStore::open_dir(d); });
  EXPECT_NE(e.find("'b'"), std::string::npos) << e;
  EXPECT_NE(e.find("s1.safetensors"), std::string::npos) << e;
  // shard holds a tensor the index does not list
  std::ofstream(d + "/model.safetensors.index.json") << R"({"weight_map":{"a":"s1.safetensors"}})";
  write_safetensors(d + "/s1.safetensors", {tensor_f32("a", {1}, v), tensor_f32("extra", {1}, v)});
  e = error_of([&] { TensorStore::open_dir(d); });
  EXPECT_NE(e.find("'extra'"), std::string::npos) << e;
  std::ofstream(d + "/model.safetensors.index.json") << R"({"weight_map":{"a":"missing.safetensors"}})";
  EXPECT_NE(error_of([&] { TensorStore::open_dir(d); }).find("does not exist"), std::string::npos);
}

// A DOM would keep the last of two same-named entries silently.
TEST(Safetensors, DuplicateNamesAndFieldsAreRejected) {
  std::string d = tmpdir();
  const std::string e1 = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  write_raw(d + "/dup.safetensors", "{" + e1 + "," + e1 + "}", std::string(4, '\0'));
  std::string e = error_of([&] { SafetensorsFile f(d + "/dup.safetensors"); });
  EXPECT_NE(e.find("tensor 'a' appears twice"), std::string::npos) << e;
  write_raw(d + "/dupf.safetensors", R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})",
            std::string(4, '\0'));
  e = error_of([&] { SafetensorsFile f(d + "/dupf.safetensors"); });
  EXPECT_NE(e.find("field 'dtype' appears twice"), std::string::npos) << e;
  write_raw(d + "/dupm.safetensors", R"({"__metadata__":{"k":"1","k":"2"}})", "");
  e = error_of([&] { SafetensorsFile f(d + "/dupm.safetensors"); });
  EXPECT_NE(e.find("'k' appears twice"), std::string::npos) << e;
}

// Unknown fields are skipped, but not to any depth; deep nesting anywhere is an error, not a crash.
TEST(Safetensors, NestingIsBounded) {
  std::string d = tmpdir();
  write_raw(d + "/ok.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":{"y":[1,2]}}})",
            std::string(4, '\0'));
  SafetensorsFile ok(d + "/ok.safetensors");
  EXPECT_EQ(ok.find("a")->numel(), 1);
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  write_raw(d + "/deep.safetensors",
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":)" + deep + "}}", std::string(4, '\0'));
  std::string e = error_of([&] { SafetensorsFile f(d + "/deep.safetensors"); });
  EXPECT_NE(e.find("nested deeper"), std::string::npos) << e;
  write_raw(d + "/top.safetensors", deep, "");
  e = error_of([&] { SafetensorsFile f(d + "/top.safetensors"); });
  EXPECT_NE(e.find("not a JSON object"), std::string::npos) << e;
  write_raw(d + "/shape.safetensors", R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", "");
  e = error_of([&] { SafetensorsFile f(d + "/shape.safetensors"); });
  EXPECT_NE(e.find("shape entries must be non-negative integers"), std::string::npos) << e;
  std::string dims = "1";
  for (int i = 0; i < 40; ++i) dims += ",1";
  write_raw(d + "/rank.safetensors", R"({"a":{"dtype":"F32","shape":[)" + dims + R"(],"data_offsets":[0,4]}})",
            std::string(4, '\0'));
  e = error_of([&] { SafetensorsFile f(d + "/rank.safetensors"); });
  EXPECT_NE(e.find("more than 32 dimensions"), std::string::npos) << e;
}

// A FIFO or a directory where a safetensors file belongs is an error, never a hang.
TEST(Safetensors, SpecialFilesAreRefused) {
  std::string d = tmpdir();
  ASSERT_EQ(::mkfifo((d + "/f.safetensors").c_str(), 0600), 0);
  EXPECT_NE(error_of([&] { SafetensorsFile f(d + "/f.safetensors"); }).find("not a regular file"), std::string::npos);
  fs::create_directories(d + "/dir/model.safetensors");
  EXPECT_NE(error_of([&] { TensorStore::open_dir(d + "/dir"); }).find("is a directory"), std::string::npos);
  fs::create_directories(d + "/idx/model.safetensors.index.json");
  EXPECT_NE(error_of([&] { TensorStore::open_dir(d + "/idx"); }).find("is a directory"), std::string::npos);
}

// A legal header of many small entries parses into a bounded multiple of its
// size (a JSON DOM took about 30x). Measured in a child process's peak RSS.
TEST(Safetensors, HugeHeaderMemoryIsBounded) {
#if defined(__SANITIZE_ADDRESS__)  // gcc and clang define it under -fsanitize=address
  GTEST_SKIP() << "ASan's redzones and quarantine inflate RSS; the bound is checked in the plain build";
#endif
  std::string d = tmpdir();
  std::string h = "{";
  const int n = 300000;
  for (int i = 0; i < n; ++i)
    h += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
  h += "}";
  write_raw(d + "/big.safetensors", h, "");
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    struct rusage before {}, after {};
    ::getrusage(RUSAGE_SELF, &before);
    SafetensorsFile f(d + "/big.safetensors");
    ::getrusage(RUSAGE_SELF, &after);
    const double grown = double(after.ru_maxrss - before.ru_maxrss) * 1024.0;
    ::_exit(f.tensors().size() == size_t(n) && grown < 10.0 * double(h.size()) ? 0 : 1);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "header of " << h.size() << " bytes: too many tensors parsed or too much memory";
}
