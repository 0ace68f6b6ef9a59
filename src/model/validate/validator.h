// `dsv41 validate`: an independent check of a conversion. It does not use the converter's layout
// code (model/convert/converted_layout.*): from the source tensor names it derives on its own which
// output tensors must exist, then for every output tensor it decodes both sides to numbers and
// compares them exactly (after the documented -0 -> +0 canonicalisation of FP4 nibbles), and checks
// the manifest's sha256 against the bytes. Mismatches are reported by tensor name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsv41 {

struct ValidateOptions {
  std::string from;
  std::string to;
  std::string scope = "all";  // all | dense | layer:N
};

struct ValidateReport {
  std::size_t tensors_checked = 0;
  uint64_t bytes_checked = 0;
  std::vector<std::string> mismatches;  // "tensor: what differs"
  // Of tensors_checked, how many differ. When most do, the conversion was made from another
  // checkpoint of the same shape (same config, index and tokenizer, so the source identity in the
  // manifest matches; other weights): the CLI says that once instead of one line per tensor.
  std::size_t tensors_differing = 0;
  double seconds = 0;
};

// Errors only for what prevents validating at all (unreadable source or manifest, bad scope);
// everything else is a mismatch in the report.
Result<ValidateReport> validate_conversion(const ValidateOptions& opt);

}  // namespace dsv41
