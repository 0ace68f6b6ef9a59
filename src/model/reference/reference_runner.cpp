// ReferenceRunner: the seam over ReferenceModel by replay (see reference_runner.h).
#include "model/reference/reference_runner.h"

namespace dsv41 {

template <typename T>
Result<std::unique_ptr<ReferenceRunner<T>>> ReferenceRunner<T>::load(const std::string& dir,
                                                                     const ReferenceOptions& opt) {
  auto m = ReferenceModel<T>::load(dir, opt);
  if (!m) return m.status();
  return std::unique_ptr<ReferenceRunner>(new ReferenceRunner(std::move(*m), opt.dspark));
}

template <typename T>
int32_t ReferenceRunner<T>::vocab_size() const {
  return int32_t(model_->config().text.vocab_size);
}
template <typename T>
int64_t ReferenceRunner<T>::hidden_size() const {
  return model_->config().text.hidden_size;
}
template <typename T>
int64_t ReferenceRunner<T>::max_context() const {
  return model_->config().text.max_position_embeddings;
}
template <typename T>
Status ReferenceRunner<T>::open(SeqId seq) {
  if (tokens_.count(seq)) return Status::error("sequence " + std::to_string(seq) + " is open");
  tokens_[seq] = {};
  return Status::ok();
}
template <typename T>
void ReferenceRunner<T>::free(SeqId seq) {
  tokens_.erase(seq);
  images_.erase(seq);
  if (holding_ && held_ == seq) holding_ = false;
}
template <typename T>
Status ReferenceRunner<T>::truncate(SeqId seq, int64_t length) {
  auto it = tokens_.find(seq);
  if (it == tokens_.end()) return Status::error("sequence " + std::to_string(seq) + " is not open");
  if (length < 0 || length > int64_t(it->second.size()))
    return Status::error("truncate: length " + std::to_string(length) + " is outside [0, " +
                         std::to_string(it->second.size()) + "]");
  for (const auto& img : images_[seq])
    if (length > img.start && length < img.start + img.span())
      return Status::error("truncate: length " + std::to_string(length) +
                           " cuts an image span (images are merged only whole)");
  it->second.resize(std::size_t(length));
  auto& imgs = images_[seq];
  while (!imgs.empty() && imgs.back().start >= length) imgs.pop_back();
  if (holding_ && held_ == seq) holding_ = false;  // the next step replays
  return Status::ok();
}
template <typename T>
int64_t ReferenceRunner<T>::length(SeqId seq) const {
  auto it = tokens_.find(seq);
  return it == tokens_.end() ? -1 : int64_t(it->second.size());
}

template <typename T>
Status ReferenceRunner<T>::step(const StepBatch& batch, StepOutput* out) {
  DSV41_RETURN_IF_ERROR(
      check_step_batch(batch, vocab_size(), max_context(), [&](SeqId id) { return length(id); }));
  const ModelPlan& plan = model_->plan();
  for (const auto& sl : batch.slices)
    for (int32_t l : sl.taps)
      if (l <= 0 || l >= plan.num_backbone || plan.layers[std::size_t(l)].engram >= 0)
        return Status::error("taps: layer " + std::to_string(l) +
                             " is not a backbone layer after the first without Engram (the "
                             "reference runner taps the stream between layers)");
  const int64_t V = vocab_size(), D = hidden_size(), HC = model_->config().text.hc_mult;
  out->slices.assign(batch.slices.size(), {});
  logits_t_.assign(batch.slices.size(), {});
  std::vector<T> rows;
  for (std::size_t i = 0; i < batch.slices.size(); ++i) {
    const SeqSlice& sl = batch.slices[i];
    auto& toks = tokens_[sl.seq];
    DSV41_RETURN_IF_ERROR(hold(sl.seq));
    rows.clear();
    std::vector<std::vector<T>> dump;
    std::vector<PromptImage<T>> imgs;  // slice-relative starts, as the call takes them
    for (const SliceImage& si : sl.images) {
      if (si.first != 0)  // (this path has no prefix cache: its slices hold whole spans)
        return Status::error("the reference path takes an image's span whole (first 0)");
      PromptImage<T> pi;
      pi.start = si.start, pi.llm_w = si.llm_w, pi.llm_h = si.llm_h;
      if (si.rows) pi.rows.assign(si.rows->begin(), si.rows->end());
      imgs.push_back(std::move(pi));
    }
    DSV41_RETURN_IF_ERROR(
        model_->forward(sl.tokens, imgs, &rows, sl.taps.empty() ? nullptr : &dump));
    for (auto& pi : imgs) {  // kept with sequence positions, for a replay from 0
      pi.start += sl.first_pos;
      images_[sl.seq].push_back(std::move(pi));
    }
    toks.insert(toks.end(), sl.tokens.begin(), sl.tokens.end());
    SliceOutput& so = out->slices[i];
    for (int32_t r : sl.logits_rows) {
      const auto b = rows.begin() + int64_t(r) * V;
      so.logits.insert(so.logits.end(), b, b + V);
      logits_t_[i].insert(logits_t_[i].end(), b, b + V);
    }
    // Input of layer l = output of layer l - 1 (the embedding copies for layer 0), mean of copies.
    for (int32_t l : sl.taps) {
      std::vector<float> tap(sl.tokens.size() * std::size_t(D));
      for (std::size_t t = 0; t < sl.tokens.size(); ++t)
        for (int64_t d = 0; d < D; ++d) {
          T s = 0;
          for (int64_t j = 0; j < HC; ++j) s += dump[std::size_t(l - 1)][(t * HC + j) * D + d];
          tap[t * D + d] = float(s / T(HC));
        }
      so.taps.push_back(std::move(tap));
    }
  }
  return Status::ok();
}

template <typename T>
Status ReferenceRunner<T>::hold(SeqId seq) {
  const auto& toks = tokens_.at(seq);
  if (holding_ && held_ == seq && model_->position() == int64_t(toks.size())) return Status::ok();
  model_->reset();
  holding_ = false;
  if (!toks.empty()) {
    std::vector<T> rows;
    DSV41_RETURN_IF_ERROR(model_->forward(toks, images_[seq], &rows));
  }
  held_ = seq;
  holding_ = true;
  return Status::ok();
}

template <typename T>
int64_t ReferenceRunner<T>::draft_block_size() const {
  return dspark_ ? model_->config().text.dspark_block_size : 0;
}

template <typename T>
Status ReferenceRunner<T>::draft(const std::vector<DraftQuery>& queries,
                                 std::vector<DraftResult>* out) {
  out->assign(queries.size(), {});
  DraftStep<T> d;
  for (std::size_t i = 0; i < queries.size(); ++i) {
    if (!tokens_.count(queries[i].seq))
      return Status::error("draft: sequence " + std::to_string(queries[i].seq) + " is not open");
    DSV41_RETURN_IF_ERROR(hold(queries[i].seq));
    DSV41_RETURN_IF_ERROR(model_->draft(queries[i].next, &d));
    DraftResult& r = (*out)[i];
    r.logits.assign(d.logits.begin(), d.logits.end());
    r.ids = d.ids;
    r.confidence.assign(d.confidence.begin(), d.confidence.end());
  }
  return Status::ok();
}

template class ReferenceRunner<float>;
template class ReferenceRunner<double>;

}  // namespace dsv41
