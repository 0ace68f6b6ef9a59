// Checkpoint: index parsing and cross-checks between the index and the shard headers.
#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace dsv41 {
namespace fs = std::filesystem;
namespace {

bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\\') == std::string::npos && s.find('\0') == std::string::npos;
}

Result<std::string> read_small_file(const std::string& path, std::size_t limit) {
  std::error_code ec;
  const auto sz = fs::file_size(path, ec);
  if (ec) return Status::error(path + ": cannot stat: " + ec.message());
  if (sz > limit)
    return Status::error(path + ": file too large (" + std::to_string(sz) + " bytes)");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  Checkpoint c;
  c.dir_ = dir;
  const std::string index_path = (fs::path(dir) / kIndexFileName).string();
  std::map<std::string, std::string> weight_map;  // tensor -> shard
  std::vector<std::string> shard_names;
  bool have_total = false;
  uint64_t total = 0;
  if (fs::exists(index_path)) {
    auto text = read_small_file(index_path, 256u << 20);
    if (!text) return text.status();
    auto j = nlohmann::json::parse(text.value(), nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return Status::error(index_path + ": not a JSON object");
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      return Status::error(index_path + ": missing object 'weight_map'");
    if (j.contains("metadata") && j["metadata"].is_object() &&
        j["metadata"].contains("total_size")) {
      const auto& ts = j["metadata"]["total_size"];
      if (!ts.is_number_unsigned())
        return Status::error(index_path + ": metadata.total_size is not a non-negative integer");
      have_total = true;
      total = ts.get<uint64_t>();
    }
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string())
        return Status::error(index_path + ": weight_map entry for tensor '" + it.key() +
                             "' is not a string");
      const std::string shard = it->get<std::string>();
      if (!plain_file_name(shard))
        return Status::error(index_path + ": tensor '" + it.key() + "' names shard '" + shard +
                             "', which is not a plain file name in the checkpoint directory");
      weight_map[it.key()] = shard;
      if (std::find(shard_names.begin(), shard_names.end(), shard) == shard_names.end())
        shard_names.push_back(shard);
    }
    if (weight_map.empty()) return Status::error(index_path + ": weight_map is empty");
    std::sort(shard_names.begin(), shard_names.end());
    for (const auto& [name, shard] : weight_map) {
      if (!fs::exists(fs::path(dir) / shard))
        return Status::error(index_path + ": tensor '" + name + "' is in shard '" + shard +
                             "', which does not exist in " + dir);
    }
  } else if (fs::exists(fs::path(dir) / kSingleShardName)) {
    shard_names.push_back(kSingleShardName);
  } else {
    return Status::error(dir + ": neither " + std::string(kIndexFileName) + " nor " +
                         kSingleShardName + " found");
  }
  c.shards_.reserve(shard_names.size());
  for (const auto& s : shard_names) {
    auto f = SafetensorsFile::open((fs::path(dir) / s).string());
    if (!f) return f.status();
    c.shards_.push_back(std::move(f.value()));
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

Status write_index_json(const std::string& dir,
                        const std::vector<std::pair<std::string, std::string>>& weight_map,
                        uint64_t total_size) {
  nlohmann::ordered_json j;
  j["metadata"] = {{"total_size", total_size}};
  nlohmann::ordered_json wm = nlohmann::ordered_json::object();
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
