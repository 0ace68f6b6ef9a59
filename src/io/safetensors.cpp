// safetensors parsing/validation and writing (format and checks described in safetensors.h).
#include "io/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace dsv41 {
namespace {

using json = nlohmann::json;

// Parses JSON refusing duplicate keys at any depth (nlohmann would silently keep the last one,
// which would let two readers of one file disagree about a tensor).
Result<json> parse_json_strict(const char* begin, const char* end, const std::string& where) {
  std::vector<std::set<std::string>> seen;
  std::string dup;
  auto cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
        seen.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!seen.empty()) seen.pop_back();
        break;
      case json::parse_event_t::key:
        if (!seen.empty() && !seen.back().insert(parsed.get<std::string>()).second && dup.empty())
          dup = parsed.get<std::string>();
        break;
      default:
        break;
    }
    return true;
  };
  json j = json::parse(begin, end, cb, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error(where + ": header is not valid JSON");
  if (!dup.empty()) return Status::error(where + ": header has duplicate key '" + dup + "'");
  return j;
}

bool checked_numel(const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n)) return false;
  }
  *out = n;
  return true;
}

Status parse_entry(const std::string& file, const std::string& name, const json& e,
                   uint64_t data_size, TensorInfo* t) {
  const std::string where = file + ": tensor '" + name + "': ";
  if (!e.is_object()) return Status::error(where + "entry is not an object");
  for (auto it = e.begin(); it != e.end(); ++it) {
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      return Status::error(where + "unknown field '" + it.key() + "'");
  }
  if (!e.contains("dtype") || !e["dtype"].is_string())
    return Status::error(where + "missing or non-string 'dtype'");
  auto dt = parse_dtype(e["dtype"].get<std::string>());
  if (!dt) return Status::error(where + "unknown dtype '" + e["dtype"].get<std::string>() + "'");
  if (!e.contains("shape") || !e["shape"].is_array())
    return Status::error(where + "missing or non-array 'shape'");
  if (e["shape"].size() > 16) return Status::error(where + "shape has more than 16 dimensions");
  std::vector<int64_t> shape;
  for (const auto& d : e["shape"]) {
    if (!d.is_number_integer() ||
        (d.is_number_integer() && !d.is_number_unsigned() && d.get<int64_t>() < 0))
      return Status::error(where + "shape entries must be non-negative integers");
    if (d.get<uint64_t>() > uint64_t(INT64_MAX))
      return Status::error(where + "shape entry too large");
    shape.push_back(d.get<int64_t>());
  }
  if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
    return Status::error(where + "'data_offsets' must be an array of two integers");
  for (const auto& o : e["data_offsets"]) {
    if (!o.is_number_unsigned())
      return Status::error(where + "'data_offsets' must be non-negative integers");
  }
  const uint64_t begin = e["data_offsets"][0].get<uint64_t>();
  const uint64_t end = e["data_offsets"][1].get<uint64_t>();
  if (begin > end) return Status::error(where + "data_offsets begin > end");
  uint64_t numel, nbytes;
  if (!checked_numel(shape, &numel) || __builtin_mul_overflow(numel, dtype_size(*dt), &nbytes))
    return Status::error(where + "shape " + shape_to_string(shape) + " overflows");
  if (end - begin != nbytes)
    return Status::error(where + "byte range [" + std::to_string(begin) + ", " +
                         std::to_string(end) + ") holds " + std::to_string(end - begin) +
                         " bytes but shape " + shape_to_string(shape) + " x " +
                         std::string(dtype_name(*dt)) + " needs " + std::to_string(nbytes));
  if (end > data_size)
    return Status::error(where + "byte range ends at " + std::to_string(end) +
                         " beyond the data section (" + std::to_string(data_size) +
                         " bytes; file truncated?)");
  *t = TensorInfo{name, *dt, std::move(shape), begin, end};
  return Status::ok();
}

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
  auto hj = parse_json_strict(hb, hb + n, path);
  if (!hj) return hj.status();
  const json& h = hj.value();
  if (!h.is_object()) return Status::error(path + ": header is not a JSON object");
  const uint64_t data_size = size - 8 - n;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Status::error(path + ": __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return Status::error(path + ": __metadata__ value '" + m.key() + "' is not a string");
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    if (it.key().empty()) return Status::error(path + ": tensor with an empty name");
    TensorInfo t;
    DSV41_RETURN_IF_ERROR(parse_entry(path, it.key(), *it, data_size, &t));
    f.tensors_.push_back(std::move(t));
  }
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

Status write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                         const TensorFiller& fill,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<std::size_t> order(specs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return dtype_size(specs[a].dtype) > dtype_size(specs[b].dtype);
  });
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
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
