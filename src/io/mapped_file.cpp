// MappedFile: open + fstat + mmap(PROT_READ, MAP_PRIVATE); empty files map to a null view.
#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dsv41 {

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error(path + ": not a regular file");
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = std::size_t(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return Status::error(path + ": cannot mmap: " + std::strerror(err));
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

void MappedFile::release(const uint8_t* ptr, std::size_t len) const {
  const auto page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = (uintptr_t(ptr) + page - 1) & ~(page - 1),
                  e = (uintptr_t(ptr) + len) & ~(page - 1);
  if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace dsv41
