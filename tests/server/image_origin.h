// A web server on 127.0.0.1 that image URL tests fetch from (issue 33 item 4): a PNG, a 404, an
// HTML page, an answer that never comes, a body that trickles, a 1 GB body (chunked, and declared
// by Content-Length), redirects (to the PNG, in a loop, to a file:// URL); plus a raw socket that
// trickles header lines forever. It counts what it sent and whether the client left.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/test_util.h"

namespace dsv41::server_testing {

inline const std::string kOriginPng = std::string(DSV41_JS_DIR) + "/../fuzz/corpus/image/rgb.png";

class ImageOrigin {
 public:
  static constexpr std::size_t kHugeBytes = std::size_t(1) << 30;

  ImageOrigin() : png_(dsv41::testing::read_file(kOriginPng)) {
    srv_.Get("/img.png", [this](const httplib::Request&, httplib::Response& r) {
      r.set_content(png_, "image/png");
    });
    srv_.Get("/missing", [](const httplib::Request&, httplib::Response& r) {
      r.status = 404;
      r.set_content("not here", "text/plain");
    });
    srv_.Get("/page", [](const httplib::Request&, httplib::Response& r) {
      r.set_content("<!DOCTYPE html><html><body>a page, not a picture</body></html>", "text/html");
    });
    srv_.Get("/slow", [this](const httplib::Request&, httplib::Response& r) {
      wait(std::chrono::seconds(30));
      r.set_content(png_, "image/png");
    });
    // The PNG's first bytes, then one byte every 100 ms: each read is quick, the whole is not.
    srv_.Get("/trickle", [this](const httplib::Request&, httplib::Response& r) {
      r.set_chunked_content_provider("image/png", [this](std::size_t off, httplib::DataSink& s) {
        if (off >= png_.size() || stop_) return false;
        if (off > 0) wait(std::chrono::milliseconds(100));
        return s.write(png_.data() + off, off == 0 ? 16 : 1);
      });
    });
    srv_.Get("/huge", [this](const httplib::Request&, httplib::Response& r) {
      r.set_chunked_content_provider(
          "image/png", [this](std::size_t off, httplib::DataSink& s) { return send_huge(off, s); });
    });
    srv_.Get("/huge-declared", [this](const httplib::Request&, httplib::Response& r) {
      r.set_content_provider(
          kHugeBytes, "image/png",
          [this](std::size_t off, std::size_t, httplib::DataSink& s) { return send_huge(off, s); });
    });
    srv_.Get("/redirect", [](const httplib::Request&, httplib::Response& r) {
      r.set_redirect("/img.png", 302);
    });
    srv_.Get("/redirect-absolute", [this](const httplib::Request&, httplib::Response& r) {
      r.set_redirect(url("/redirect"), 301);
    });
    srv_.Get(R"(/loop/(\d+))", [](const httplib::Request& q, httplib::Response& r) {
      r.set_redirect("/loop/" + std::to_string(std::stoi(q.matches[1]) + 1), 307);
    });
    srv_.Get("/to-file", [](const httplib::Request&, httplib::Response& r) {
      r.set_redirect("file:///etc/passwd", 302);
    });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    start_header_trickler();
  }
  ~ImageOrigin() {
    stop_ = true;
    srv_.stop();
    thread_.join();
    ::shutdown(raw_fd_, SHUT_RDWR);
    ::close(raw_fd_);
    raw_thread_.join();
    std::lock_guard lock(conns_m_);
    for (auto& t : conns_) t.join();
  }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  // A server that answers "HTTP/1.1 200 OK" and then a header line every 200 ms, never ending.
  std::string trickling_headers_url() const {
    return "http://127.0.0.1:" + std::to_string(raw_port_) + "/img.png";
  }
  const std::string& png() const { return png_; }
  // /huge and /huge-declared: bytes written, and whether a write failed (the client left).
  std::size_t huge_sent() const { return huge_sent_; }
  bool huge_client_left() const { return huge_left_; }
  void reset_huge() {
    huge_sent_ = 0;
    huge_left_ = false;
  }
  // Waits (up to 10 s) until the huge body's client has left.
  bool wait_huge_client_left() const {
    for (int i = 0; i < 200 && !huge_left_; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return huge_left_;
  }

 private:
  void wait(std::chrono::milliseconds t) {
    const auto end = std::chrono::steady_clock::now() + t;
    while (!stop_ && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  bool send_huge(std::size_t off, httplib::DataSink& s) {
    if (stop_ || off >= kHugeBytes) {
      s.done();
      return true;
    }
    // A PNG's signature first (so the body passes for an image until its size gives it away).
    std::string chunk(std::size_t(64) << 10, '\0');
    if (off == 0) chunk.replace(0, 8, png_.substr(0, 8));
    if (!s.write(chunk.data(), chunk.size())) {
      huge_left_ = true;
      return false;
    }
    huge_sent_ += chunk.size();
    return true;
  }
  void start_header_trickler() {
    raw_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(raw_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(raw_fd_, 8);
    socklen_t len = sizeof(a);
    ::getsockname(raw_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    raw_port_ = ntohs(a.sin_port);
    raw_thread_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(raw_fd_, nullptr, nullptr);
        if (c < 0) return;  // the listener was shut down
        std::lock_guard lock(conns_m_);
        conns_.emplace_back([this, c] {
          char buf[4096];
          (void)::recv(c, buf, sizeof(buf), 0);
          std::string line = "HTTP/1.1 200 OK\r\n";
          for (int i = 0; !stop_ && i < 300; ++i) {
            if (::send(c, line.data(), line.size(), MSG_NOSIGNAL) < 0) break;
            line = "X-Wait-" + std::to_string(i) + ": more\r\n";
            wait(std::chrono::milliseconds(200));
          }
          ::close(c);
        });
      }
    });
  }

  std::string png_;
  httplib::Server srv_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false}, huge_left_{false};
  std::atomic<std::size_t> huge_sent_{0};
  int raw_fd_ = -1, raw_port_ = 0;
  std::thread raw_thread_;
  std::mutex conns_m_;
  std::vector<std::thread> conns_;
};

}  // namespace dsv41::server_testing
