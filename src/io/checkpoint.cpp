// Checkpoint: index parsing and cross-checks between the index and the shard headers.
#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "core/thread_pool.h"
#include "io/text_file.h"

namespace dsv41 {
namespace fs = std::filesystem;
namespace {

bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\\') == std::string::npos && s.find('\0') == std::string::npos;
}

// Streaming parse of model.safetensors.index.json: collects weight_map (tensor -> shard file, each
// a plain file name) and metadata.total_size; everything else is skipped. Linear, no DOM: the
// released index has 96,085 entries.
class IndexParser : public nlohmann::json_sax<nlohmann::json> {
 public:
  IndexParser(const std::string& file, std::unordered_map<std::string, std::string>* map)
      : file_(file), map_(map) {}
  const std::string& error() const { return error_; }
  bool saw_weight_map() const { return saw_weight_map_; }
  const std::optional<uint64_t>& total() const { return total_; }

  bool null() override { return value("null"); }
  bool boolean(bool) override { return value("a boolean"); }
  bool number_integer(number_integer_t) override { return value("a negative integer"); }
  bool number_unsigned(number_unsigned_t v) override {
    if (depth_ == 2 && section_ == kMetadata && key_ == "total_size") {
      total_ = v;
      return true;
    }
    return value("a number");
  }
  bool number_float(number_float_t, const string_t&) override { return value("a number"); }
  bool binary(binary_t&) override { return value("binary"); }
  bool string(string_t& v) override {
    if (depth_ == 2 && section_ == kWeightMap) {
      if (!plain_file_name(v))
        return fail(file_ + ": tensor '" + key_ + "' names shard '" + v +
                    "', which is not a plain file name in the checkpoint directory");
      if (!map_->emplace(key_, v).second)
        return fail(file_ + ": tensor '" + key_ + "' is listed twice");
      return true;
    }
    return value("a string");
  }
  bool start_object(std::size_t) override {
    if (depth_ == 1) {
      section_ = key_ == "weight_map" ? kWeightMap : key_ == "metadata" ? kMetadata : kOther;
      saw_weight_map_ |= section_ == kWeightMap;
    } else if (!enter_container()) {
      return false;
    }
    ++depth_;
    return true;
  }
  bool end_object() override {
    if (--depth_ == 1) section_ = kOther;
    return true;
  }
  bool start_array(std::size_t) override {
    if (depth_ == 0) return fail(file_ + ": not a JSON object");
    if (!enter_container()) return false;
    ++depth_;
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool key(string_t& k) override {
    key_ = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return fail(file_ + ": not a JSON object");
  }

 private:
  enum Section { kOther, kWeightMap, kMetadata };
  bool enter_container() {
    if (depth_ == 1 && key_ == "weight_map") return fail(file_ + ": missing object 'weight_map'");
    if (depth_ == 2 && section_ == kWeightMap)
      return fail(file_ + ": weight_map entry for tensor '" + key_ + "' is not a string");
    if (depth_ == 2 && section_ == kMetadata && key_ == "total_size")
      return fail(file_ + ": metadata.total_size is not a non-negative integer");
    return true;
  }
  bool value(const char* kind) {
    if (depth_ == 0) return fail(file_ + ": not a JSON object");
    if (depth_ == 1 && key_ == "weight_map") return fail(file_ + ": missing object 'weight_map'");
    if (depth_ == 2 && section_ == kWeightMap)
      return fail(file_ + ": weight_map entry for tensor '" + key_ + "' is not a string (got " +
                  kind + ")");
    if (depth_ == 2 && section_ == kMetadata && key_ == "total_size")
      return fail(file_ + ": metadata.total_size is not a non-negative integer");
    return true;
  }
  bool fail(std::string m) {
    if (error_.empty()) error_ = std::move(m);
    return false;
  }
  const std::string& file_;
  std::unordered_map<std::string, std::string>* map_;
  int depth_ = 0;
  Section section_ = kOther;
  std::string key_, error_;
  bool saw_weight_map_ = false;
  std::optional<uint64_t> total_;
};

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  Checkpoint c;
  c.dir_ = dir;
  const std::string index_path = (fs::path(dir) / kIndexFileName).string();
  std::unordered_map<std::string, std::string> weight_map;  // tensor -> shard
  std::vector<std::string> shard_names;
  bool have_total = false;
  uint64_t total = 0;
  if (fs::exists(index_path)) {
    auto text = read_text_file(index_path, 256u << 20);
    if (!text) return text.status();
    IndexParser parser(index_path, &weight_map);
    if (!nlohmann::json::sax_parse(text.value(), &parser))
      return Status::error(parser.error().empty() ? index_path + ": not a JSON object"
                                                  : parser.error());
    if (!parser.saw_weight_map())
      return Status::error(index_path + ": missing object 'weight_map'");
    have_total = parser.total().has_value();
    total = parser.total().value_or(0);
    if (weight_map.empty()) return Status::error(index_path + ": weight_map is empty");
    // One existence check per shard (not per tensor); the error names the shard's first tensor.
    std::map<std::string, std::string> first_tensor;
    for (const auto& [name, shard] : weight_map) {
      auto [it, fresh] = first_tensor.emplace(shard, name);
      if (!fresh && name < it->second) it->second = name;
    }
    for (const auto& [shard, name] : first_tensor) {
      // A name the file system refuses (found by fuzz_checkpoint_index: one over NAME_MAX made
      // the throwing exists() end the process) is an error of the index.
      std::error_code ec;
      const bool exists = fs::exists(fs::path(dir) / shard, ec);
      if (ec)
        return Status::error(index_path + ": tensor '" + name + "' is in shard '" +
                             shard.substr(0, 200) + (shard.size() > 200 ? "...'" : "'") +
                             ", which cannot be looked up: " + ec.message());
      if (!exists)
        return Status::error(index_path + ": tensor '" + name + "' is in shard '" + shard +
                             "', which does not exist in " + dir);
      shard_names.push_back(shard);
    }
  } else if (fs::exists(fs::path(dir) / kSingleShardName)) {
    shard_names.push_back(kSingleShardName);
  } else {
    return Status::error(dir + ": neither " + std::string(kIndexFileName) + " nor " +
                         kSingleShardName + " found");
  }
  // Shard headers are independent: parse them in parallel (the released checkpoint has 48).
  std::vector<std::optional<Result<SafetensorsFile>>> opened(shard_names.size());
  ThreadPool pool(std::min<std::size_t>(shard_names.size(), std::thread::hardware_concurrency()));
  pool.parallel_for(shard_names.size(), [&](std::size_t b, std::size_t e, std::size_t) {
    for (std::size_t i = b; i < e; ++i)
      opened[i].emplace(SafetensorsFile::open((fs::path(dir) / shard_names[i]).string()));
  });
  c.shards_.reserve(shard_names.size());
  for (auto& f : opened) {
    if (!f->is_ok()) return f->status();
    c.shards_.push_back(std::move(f->value()));
  }
  for (std::size_t si = 0; si < c.shards_.size(); ++si) {
    const auto& shard = c.shards_[si];
    for (const auto& t : shard.tensors()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(t.name);
        if (it == weight_map.end())
          return Status::error(shard.path() + ": tensor '" + t.name + "' is not listed in " +
                               kIndexFileName);
        if (it->second != shard_names[si])
          return Status::error(shard.path() + ": tensor '" + t.name + "' is indexed in shard '" +
                               it->second + "'");
      }
      if (c.entries_.count(t.name))
        return Status::error(shard.path() + ": tensor '" + t.name +
                             "' appears in more than one shard");
      c.entries_[t.name] = Entry{&t, si};
      c.names_.push_back(t.name);
      c.total_bytes_ += t.nbytes();
    }
  }
  for (const auto& [name, shard] : weight_map) {
    if (!c.entries_.count(name))
      return Status::error(index_path + ": tensor '" + name + "' is missing from shard '" + shard +
                           "'");
  }
  if (have_total && total != c.total_bytes_)
    return Status::error(index_path + ": metadata.total_size " + std::to_string(total) +
                         " != sum of tensor bytes " + std::to_string(c.total_bytes_));
  std::sort(c.names_.begin(), c.names_.end());
  return c;
}

const Checkpoint::Entry* Checkpoint::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

std::span<const uint8_t> Checkpoint::bytes(const std::string& name) const {
  const Entry* e = find(name);
  DSV41_CHECK_MSG(e != nullptr, name.c_str());
  return shards_[e->shard].bytes(*e->info);
}

void Checkpoint::release_bytes(const std::string& name, const uint8_t* p, std::size_t n) const {
  if (const Entry* e = find(name)) shards_[e->shard].release_bytes(p, n);
}

void Checkpoint::release(const std::string& name) const {
  if (const Entry* e = find(name)) shards_[e->shard].release(*e->info);
}

Status write_index_json(const std::string& dir,
                        const std::vector<std::pair<std::string, std::string>>& weight_map,
                        uint64_t total_size) {
  nlohmann::json j;
  j["metadata"] = {{"total_size", total_size}};
  nlohmann::json wm = nlohmann::json::object();
  auto sorted = weight_map;
  std::sort(sorted.begin(), sorted.end());
  for (const auto& [name, shard] : sorted) wm[name] = shard;
  j["weight_map"] = wm;
  const std::string path = (fs::path(dir) / kIndexFileName).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::error(path + ": cannot create");
  out << j.dump(2) << "\n";
  out.close();
  if (!out) return Status::error(path + ": write failed");
  return Status::ok();
}

}  // namespace dsv41
