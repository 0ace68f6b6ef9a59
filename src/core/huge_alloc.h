// HugeVector: a std::vector whose blocks of 2 MB or more start on a 2 MB boundary and are advised
// for transparent huge pages (MADV_HUGEPAGE). For large buffers that a measurement streams (the
// benches' read probes and weight sets), so that they are read with the TLB behaviour of the
// engine's weights, which load onto huge pages (ConvertedWeights::warm). Smaller blocks come from
// operator new as usual.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace dsv41 {

// The x86-64 transparent huge page (PMD) size.
constexpr std::size_t kHugePageBytes = std::size_t(2) << 20;

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "small blocks use operator new");
  static constexpr std::size_t kHuge = kHugePageBytes;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  static std::size_t rounded(std::size_t bytes) { return (bytes + kHuge - 1) / kHuge * kHuge; }
  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < kHuge) return static_cast<T*>(::operator new(bytes));
    void* p = std::aligned_alloc(kHuge, rounded(bytes));
    if (!p) throw std::bad_alloc();
    ::madvise(p, rounded(bytes), MADV_HUGEPAGE);  // advice: without THP the buffer still works
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n * sizeof(T) < kHuge)
      ::operator delete(p);
    else
      std::free(p);
  }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

template <typename T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace dsv41
