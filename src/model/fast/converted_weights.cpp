// Mapping a converted checkpoint's data files and indexing its tensors (see converted_weights.h).
#include "model/fast/converted_weights.h"

#include <filesystem>
#include <map>

#include "model/convert/converted_checkpoint.h"

namespace dsv41 {

Result<std::unique_ptr<ConvertedWeights>> ConvertedWeights::open(const std::string& dir,
                                                                 bool verify) {
  namespace fs = std::filesystem;
  auto ck = open_converted_checkpoint(dir, verify);
  if (!ck) return ck.status();
  std::unique_ptr<ConvertedWeights> w(new ConvertedWeights());
  w->dir_ = dir;
  w->fp8_ = ck->manifest.fp8;
  w->config_ = ck->config;
  w->payload_bytes_ = ck->payload_bytes;
  std::map<std::string, const MappedFile*> by_name;
  for (const auto& f : ck->manifest.files) {
    auto mf = MappedFile::open((fs::path(dir) / f.name).string());
    if (!mf) return mf.status();
    by_name[f.name] = mf->get();
    w->files_.push_back(*mf);
  }
  for (const auto& t : ck->manifest.tensors) {
    const MappedFile* mf = by_name.at(t.file);  // the loader checked every file is listed
    if (t.offset + t.bytes > mf->size())
      return Status::error(t.name + ": beyond the end of " + t.file);
    w->spans_[t.name] =
        WeightSpan{mf->data() + t.offset, t.bytes, t.dtype, t.shape, t.layout == "fp8_to_bf16"};
  }
  return w;
}

const WeightSpan& ConvertedWeights::get(const std::string& name) const {
  auto it = spans_.find(name);
  DSV41_CHECK_MSG(it != spans_.end(), name.c_str());
  return it->second;
}

}  // namespace dsv41
