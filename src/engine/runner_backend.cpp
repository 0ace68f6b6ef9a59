// ModelBackend over the model seam (model/seam.h): one sequence (id 1) driven through step(), so
// the one-request-at-a-time engine runs on the fast forward until the scheduler (continuous
// batching over the seam) replaces this adapter.
#include "engine/model_backend.h"
#include "model/fast/fast_model.h"

namespace dsv41 {
namespace {

class RunnerBackend final : public ModelBackend {
 public:
  explicit RunnerBackend(std::unique_ptr<ModelRunner> r) : runner_(std::move(r)) {
    (void)runner_->open(kSeq);
  }
  int32_t vocab_size() const override { return runner_->vocab_size(); }
  int64_t max_context() const override { return runner_->max_context(); }
  void reset() override {
    runner_->free(kSeq);
    (void)runner_->open(kSeq);
  }
  Status forward(const std::vector<int32_t>& tokens, std::vector<float>& last_logits) override {
    batch_.slices.resize(1);
    SeqSlice& s = batch_.slices[0];
    s.seq = kSeq;
    s.first_pos = runner_->length(kSeq);
    s.tokens = tokens;
    s.logits_rows.assign(1, int32_t(tokens.size()) - 1);
    DSV41_RETURN_IF_ERROR(runner_->step(batch_, &out_));
    last_logits = out_.slices[0].logits;
    return Status::ok();
  }

 private:
  static constexpr SeqId kSeq = 1;
  std::unique_ptr<ModelRunner> runner_;
  StepBatch batch_;
  StepOutput out_;
};

}  // namespace

Result<std::unique_ptr<ModelBackend>> load_fast_backend(const std::string& converted_dir,
                                                        const FastBackendOptions& o) {
  FastOptions fo;
  fo.threads = o.threads;
  fo.act_quant = o.act_quant;
  fo.kv_cache_bytes = int64_t(o.kv_cache_gb * 1e9);
  auto m = FastModel::load(converted_dir, fo);
  if (!m) return m.status();
  return std::unique_ptr<ModelBackend>(new RunnerBackend(std::move(*m)));
}

}  // namespace dsv41
