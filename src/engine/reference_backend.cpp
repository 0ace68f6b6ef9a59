// ModelBackend over ReferenceModel<float>: the slow but exact path the server runs until the fast
// engine exists. Only the last row of logits is kept per call.
#include "engine/model_backend.h"
#include "model/reference/reference_model.h"

namespace dsv41 {
namespace {

class ReferenceBackend final : public ModelBackend {
 public:
  explicit ReferenceBackend(std::unique_ptr<ReferenceModel<float>> m) : model_(std::move(m)) {}
  int32_t vocab_size() const override {
    return static_cast<int32_t>(model_->config().text.vocab_size);
  }
  int64_t max_context() const override { return model_->config().text.max_position_embeddings; }
  void reset() override { model_->reset(); }
  Status forward(const std::vector<int32_t>& tokens, std::vector<float>& last_logits) override {
    rows_.clear();
    DSV41_RETURN_IF_ERROR(model_->forward(tokens, &rows_));
    const std::size_t v = static_cast<std::size_t>(vocab_size());
    last_logits.assign(rows_.end() - static_cast<std::ptrdiff_t>(v), rows_.end());
    return Status::ok();
  }

 private:
  std::unique_ptr<ReferenceModel<float>> model_;
  std::vector<float> rows_;
};

}  // namespace

Result<std::unique_ptr<ModelBackend>> load_reference_backend(const std::string& model_dir) {
  auto m = ReferenceModel<float>::load(model_dir, ReferenceOptions{});
  if (!m) return m.status();
  return std::unique_ptr<ModelBackend>(new ReferenceBackend(std::move(*m)));
}

}  // namespace dsv41
