// safetensors parsing/validation and writing (format and checks described in safetensors.h).
#include "io/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_set>

namespace dsv41 {
namespace {

using json = nlohmann::json;

bool checked_numel(const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n)) return false;
  }
  *out = n;
  return true;
}

// One streaming (SAX) pass over the header that validates as it goes and builds TensorInfo
// directly: linear in the header size, with no DOM (the released checkpoint has ~2,000 tensors per
// shard). Duplicate keys are refused at every depth (a DOM parser would keep the last one silently,
// letting two readers disagree about a tensor). The first error stops the parse.
class HeaderParser : public nlohmann::json_sax<json> {
 public:
  HeaderParser(const std::string& file, uint64_t data_size, std::vector<TensorInfo>* tensors,
               std::map<std::string, std::string>* metadata)
      : file_(file), data_size_(data_size), tensors_(tensors), metadata_(metadata) {}

  const std::string& error() const { return error_; }

  bool null() override { return scalar("null"); }
  bool boolean(bool) override { return scalar("boolean"); }
  bool number_integer(number_integer_t v) override {
    if (state_ == kShape) return fail(where() + "shape entries must be non-negative integers");
    (void)v;
    return scalar("integer");
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (state_ == kShape) {
      if (v > uint64_t(INT64_MAX)) return fail(where() + "shape entry too large");
      if (shape_.size() == 16) return fail(where() + "shape has more than 16 dimensions");
      shape_.push_back(int64_t(v));
      return true;
    }
    if (state_ == kOffsets) {
      offsets_.push_back(v);
      return true;
    }
    return scalar("integer");
  }
  bool number_float(number_float_t, const string_t&) override { return scalar("float"); }
  bool string(string_t& v) override {
    if (state_ == kMetadata) {
      (*metadata_)[key_] = v;
      return true;
    }
    if (state_ == kEntry && key_ == "dtype") {
      dtype_ = v;
      have_dtype_ = true;
      return true;
    }
    return scalar("string");
  }
  bool binary(binary_t&) override { return scalar("binary"); }

  bool start_object(std::size_t) override {
    switch (state_) {
      case kStart:
        state_ = kTop;
        return true;
      case kTop:
        if (key_ == "__metadata__") {
          state_ = kMetadata;
        } else {
          state_ = kEntry;
          name_ = key_;
          have_dtype_ = have_shape_ = have_offsets_ = false;
          shape_.clear();
          offsets_.clear();
        }
        keys_.emplace_back();
        return true;
      default:
        return scalar("object");
    }
  }
  bool key(string_t& k) override {
    if (state_ == kTop) {
      if (!top_keys_.insert(k).second)
        return fail(file_ + ": header has duplicate key '" + k + "'");
      if (k.empty()) return fail(file_ + ": tensor with an empty name");
    } else {
      if (!keys_.back().insert(k).second)
        return fail(file_ + ": header has duplicate key '" + k + "'");
      if (state_ == kEntry && k != "dtype" && k != "shape" && k != "data_offsets")
        return fail(where() + "unknown field '" + k + "'");
    }
    key_ = k;
    return true;
  }
  bool end_object() override {
    if (state_ == kTop) return true;  // end of the header
    keys_.pop_back();
    const bool entry = state_ == kEntry;
    state_ = kTop;
    return entry ? finish_entry() : true;
  }
  bool start_array(std::size_t) override {
    if (state_ == kEntry && key_ == "shape") {
      state_ = kShape;
      have_shape_ = true;
      return true;
    }
    if (state_ == kEntry && key_ == "data_offsets") {
      state_ = kOffsets;
      have_offsets_ = true;
      return true;
    }
    return scalar("array");
  }
  bool end_array() override {
    if (state_ == kOffsets && offsets_.size() != 2)
      return fail(where() + "'data_offsets' must be an array of two integers");
    state_ = kEntry;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return fail(file_ + ": header is not valid JSON");
  }

 private:
  enum State { kStart, kTop, kMetadata, kEntry, kShape, kOffsets };

  std::string where() const { return file_ + ": tensor '" + name_ + "': "; }
  bool fail(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
    return false;
  }
  // A value of the wrong kind for the current position.
  bool scalar(const char* kind) {
    switch (state_) {
      case kStart:
        return fail(file_ + ": header is not a JSON object");
      case kTop:
        if (key_ == "__metadata__") return fail(file_ + ": __metadata__ is not an object");
        name_ = key_;
        return fail(where() + "entry is not an object (got " + kind + ")");
      case kMetadata:
        return fail(file_ + ": __metadata__ value '" + key_ + "' is not a string");
      case kEntry:
        if (key_ == "dtype") return fail(where() + "missing or non-string 'dtype'");
        if (key_ == "shape") return fail(where() + "missing or non-array 'shape'");
        return fail(where() + "'data_offsets' must be an array of two integers");
      case kShape:
        return fail(where() + "shape entries must be non-negative integers");
      case kOffsets:
        return fail(where() + "'data_offsets' must be non-negative integers");
    }
    return false;
  }
  bool finish_entry() {
    if (!have_dtype_) return fail(where() + "missing or non-string 'dtype'");
    const auto dt = parse_dtype(dtype_);
    if (!dt) return fail(where() + "unknown dtype '" + dtype_ + "'");
    if (!have_shape_) return fail(where() + "missing or non-array 'shape'");
    if (!have_offsets_) return fail(where() + "'data_offsets' must be an array of two integers");
    const uint64_t begin = offsets_[0], end = offsets_[1];
    if (begin > end) return fail(where() + "data_offsets begin > end");
    uint64_t numel, nbytes;
    if (!checked_numel(shape_, &numel) || __builtin_mul_overflow(numel, dtype_size(*dt), &nbytes))
      return fail(where() + "shape " + shape_to_string(shape_) + " overflows");
    if (end - begin != nbytes)
      return fail(where() + "byte range [" + std::to_string(begin) + ", " + std::to_string(end) +
                  ") holds " + std::to_string(end - begin) + " bytes but shape " +
                  shape_to_string(shape_) + " x " + std::string(dtype_name(*dt)) + " needs " +
                  std::to_string(nbytes));
    if (end > data_size_)
      return fail(where() + "byte range ends at " + std::to_string(end) +
                  " beyond the data section (" + std::to_string(data_size_) +
                  " bytes; file truncated?)");
    tensors_->push_back(TensorInfo{name_, *dt, shape_, begin, end});
    return true;
  }

  const std::string& file_;
  const uint64_t data_size_;
  std::vector<TensorInfo>* tensors_;
  std::map<std::string, std::string>* metadata_;
  State state_ = kStart;
  std::string key_, name_, dtype_, error_;
  std::vector<int64_t> shape_;
  std::vector<uint64_t> offsets_;
  bool have_dtype_ = false, have_shape_ = false, have_offsets_ = false;
  std::unordered_set<std::string> top_keys_;
  std::vector<std::unordered_set<std::string>> keys_;
};

}  // namespace

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

uint64_t TensorSpec::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto mf = MappedFile::open(path);
  if (!mf) return mf.status();
  SafetensorsFile f;
  f.file_ = std::move(mf.value());
  const uint64_t size = f.file_->size();
  if (size < 8)
    return Status::error(path + ": file too small for a safetensors header (" +
                         std::to_string(size) + " bytes)");
  uint64_t n;
  std::memcpy(&n, f.file_->data(), 8);  // little-endian host (x86-64)
  if (n == 0) return Status::error(path + ": header length is 0");
  if (n > kMaxSafetensorsHeader)
    return Status::error(path + ": header length " + std::to_string(n) +
                         " exceeds the 100 MB limit");
  if (n > size - 8)
    return Status::error(path + ": header length " + std::to_string(n) + " exceeds the file size " +
                         std::to_string(size) + " (file truncated?)");
  f.header_size_ = n;
  const char* hb = reinterpret_cast<const char*>(f.file_->data() + 8);
  if (hb[0] != '{') return Status::error(path + ": header does not start with '{'");
  const uint64_t data_size = size - 8 - n;
  HeaderParser parser(path, data_size, &f.tensors_, &f.metadata_);
  if (!json::sax_parse(hb, hb + n, &parser))
    return Status::error(parser.error().empty() ? path + ": header is not valid JSON"
                                                : parser.error());
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (std::size_t i = 0; i < f.tensors_.size(); ++i) {
    const TensorInfo& t = f.tensors_[i];
    if (t.begin < cursor)
      return Status::error(path + ": tensor '" + t.name + "' overlaps tensor '" +
                           f.tensors_[i - 1].name + "'");
    if (t.begin > cursor)
      return Status::error(path + ": gap of " + std::to_string(t.begin - cursor) +
                           " bytes before tensor '" + t.name + "'");
    cursor = t.end;
  }
  if (cursor != data_size)
    return Status::error(path + ": " + std::to_string(data_size - cursor) +
                         " trailing bytes after the last tensor (data section " +
                         std::to_string(data_size) + " bytes)");
  for (std::size_t i = 0; i < f.tensors_.size(); ++i) f.by_name_[f.tensors_[i].name] = i;
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorInfo& t) const {
  const uint8_t* base = file_->data() + 8 + header_size_;
  return {base + t.begin, std::size_t(t.nbytes())};
}

void SafetensorsFile::release_bytes(const uint8_t* p, std::size_t n) const {
  file_->release(p, n);
}

void SafetensorsFile::release(const TensorInfo& t) const {
  const auto b = bytes(t);
  file_->release(b.data(), b.size());
}

Status write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                         const TensorFiller& fill,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<std::size_t> order(specs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return dtype_size(specs[a].dtype) > dtype_size(specs[b].dtype);
  });
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (std::size_t i : order) {
    const TensorSpec& s = specs[i];
    if (h.contains(s.name))
      return Status::error(path + ": duplicate tensor '" + s.name + "' to write");
    const uint64_t nb = s.nbytes();
    h[s.name] = {{"dtype", std::string(dtype_name(s.dtype))},
                 {"shape", s.shape},
                 {"data_offsets", {off, off + nb}}};
    off += nb;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  std::FILE* fp = std::fopen(tmp.c_str(), "wb");
  if (!fp) return Status::error(tmp + ": cannot create: " + std::strerror(errno));
  bool ok = true;
  const uint64_t hn = header.size();
  ok &= std::fwrite(&hn, 8, 1, fp) == 1;
  ok &= std::fwrite(header.data(), 1, header.size(), fp) == header.size();
  std::vector<uint8_t> buf;
  for (std::size_t i : order) {
    if (!ok) break;
    buf.assign(specs[i].nbytes(), 0);
    fill(i, std::span<uint8_t>(buf));
    ok &= std::fwrite(buf.data(), 1, buf.size(), fp) == buf.size();
  }
  ok &= std::fclose(fp) == 0;
  if (!ok) {
    std::remove(tmp.c_str());
    return Status::error(path + ": write failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::error(path + ": cannot rename from " + tmp + ": " + ec.message());
  return Status::ok();
}

}  // namespace dsv41
