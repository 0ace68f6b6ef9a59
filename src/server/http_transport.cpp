// The event-driven HTTP/1.1 transport (http_transport.h). One I/O thread runs every connection
// (accept, TLS handshake, reading headers and bodies, writing answers), so the Session objects
// below are only touched on it and need no locks; handlers run on a small worker pool and talk
// to their connection through an Exchange, the one object both sides share (under its mutex).
// Deadlines are per phase: headers (slowloris), body, idle keep-alive, and each write's progress.
#include "server/http_transport.h"

#include <poll.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <openssl/ssl.h>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "core/log.h"

namespace dsv41::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace ssl = boost::asio::ssl;
using tcp = asio::ip::tcp;
using boost::system::error_code;

// (Named, not anonymous: Transport::Impl holds these.)
namespace transport_detail {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

// Handlers' threads: a fixed set taking tasks in order.
class WorkerPool {
 public:
  void start(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  // Runs what was queued, then joins.
  void stop_and_join() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      try {
        task();
      } catch (...) {  // (a hook's own failure: the connection is closed by its exchange)
        log::error("serve: internal error in a handler thread");
      }
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

// One answer in transit: its worker writes bytes in, the I/O thread takes them out. The limit
// holds for bytes not yet taken (what waits for a slow reader); the I/O thread takes everything
// whenever its previous write completed, so at most about twice the limit is held.
class Exchange final : public StreamSink, public Connection {
 public:
  Exchange(std::size_t limit, const std::atomic<bool>& stopping, int fd, std::string client,
           std::atomic<int64_t>& cuts)
      : limit_(limit), stopping_(stopping), fd_(fd), client_(std::move(client)), cuts_(cuts) {}

  // Set once by the session before the handler runs: how to wake the I/O thread.
  std::function<void()> kick;
  bool chunked = true;

  bool write(std::string_view data) override {
    if (data.empty()) return !gone();
    std::string frame;
    if (chunked) {
      frame = fmt::format("{:x}\r\n", data.size());
      frame.append(data);
      frame += "\r\n";
    } else {
      frame.assign(data);
    }
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_ || finished_) return false;
      // The limit is on the reader's lag (what waits before this write), not on a frame's size.
      if (pending_.size() >= limit_) {
        failed_ = true;
        cuts_.fetch_add(1);
        log::warn(
            "serve: streamed answer to {} cut: the client reads too slowly ({} bytes waiting, "
            "limit {})",
            client_, pending_.size(), limit_);
      } else {
        pending_ += frame;
      }
      wake = !kicked_;
      kicked_ = true;
    }
    if (wake) kick();
    return !failed();
  }
  void done() override {
    if (chunked) put("0\r\n\r\n");
    finish();
  }
  bool gone() const override {
    if (stopping_.load()) return true;
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_ || fd_ < 0) return true;
    // A hang-up is readable as POLLRDHUP without reading a byte (a pipelined request stays unread).
    pollfd p{fd_, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
  }

  // Worker side: bytes outside the limit (a whole answer, a stream's head) and the end.
  void put(std::string bytes) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_ || finished_) return;
      pending_ += bytes;
      wake = !kicked_;
      kicked_ = true;
    }
    if (wake) kick();
  }
  void finish(bool close = false) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      close_ = close_ || close;
      kicked_ = true;
    }
    kick();
  }
  void abort() {  // the answer cannot be completed: the connection closes
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed_ = true;
      kicked_ = true;
    }
    kick();
  }
  bool failed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }
  bool finished() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_ || failed_;
  }
  void set_close() {
    std::lock_guard<std::mutex> lock(mu_);
    close_ = true;
  }

  // I/O side.
  struct Taken {
    std::string bytes;
    bool finished = false, failed = false, close = false;
  };
  Taken take() {
    std::lock_guard<std::mutex> lock(mu_);
    Taken t;
    t.bytes.swap(pending_);
    t.finished = finished_;
    t.failed = failed_;
    t.close = close_;
    kicked_ = false;
    return t;
  }
  // The socket is closing (or a write failed): the handler learns it, its writes fail.
  void detach() {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    fd_ = -1;
  }

 private:
  const std::size_t limit_;
  const std::atomic<bool>& stopping_;
  mutable std::mutex mu_;
  int fd_;
  std::string client_;
  std::atomic<int64_t>& cuts_;
  std::string pending_;
  bool finished_ = false, failed_ = false, close_ = false, kicked_ = false;
};

const char* reason_phrase(int status) {
  const auto s = bhttp::int_to_status(unsigned(status));
  const auto r = bhttp::obsolete_reason(s);
  return r.empty() ? "Unknown" : r.data();
}

// Status line and headers. `length`: Content-Length (nullopt: chunked, or until the close).
std::string serialize_head(const Response& r, int version, bool close,
                           std::optional<std::size_t> length, bool chunked,
                           std::chrono::milliseconds keep_alive = {}) {
  std::string out = fmt::format("HTTP/1.1 {} {}\r\n", r.status, reason_phrase(r.status));
  for (const Header& h : r.headers) {
    if (iequals(h.name, "Connection") || iequals(h.name, "Content-Length") ||
        iequals(h.name, "Transfer-Encoding"))
      continue;
    out += h.name;
    out += ": ";
    out += h.value;
    out += "\r\n";
  }
  if (length) out += fmt::format("Content-Length: {}\r\n", *length);
  if (chunked) out += "Transfer-Encoding: chunked\r\n";
  if (close)
    out += "Connection: close\r\n";
  else if (version == 10)
    out += "Connection: keep-alive\r\n";
  // Clients that pool connections (node's http.Agent) retire idle ones before this, instead of
  // racing the server's idle close with their next request.
  if (!close && keep_alive.count() >= 1000)
    out += fmt::format("Keep-Alive: timeout={}\r\n", keep_alive.count() / 1000);
  out += "\r\n";
  return out;
}

}  // namespace transport_detail
using namespace transport_detail;

// ---- Request / Response ----------------------------------------------------------------------

bool Request::has_header(std::string_view name) const {
  return header_count(name) > 0;
}

std::string Request::header(std::string_view name, std::size_t k) const {
  for (const Header& h : headers)
    if (iequals(h.name, name) && k-- == 0) return h.value;
  return {};
}

std::size_t Request::header_count(std::string_view name) const {
  std::size_t n = 0;
  for (const Header& h : headers) n += iequals(h.name, name);
  return n;
}

void Response::set_header(std::string name, std::string value) {
  erase_header(name);
  headers.push_back({std::move(name), std::move(value)});
}

void Response::erase_header(std::string_view name) {
  std::erase_if(headers, [&](const Header& h) { return iequals(h.name, name); });
}

bool Response::has_header(std::string_view name) const {
  for (const Header& h : headers)
    if (iequals(h.name, name)) return true;
  return false;
}

std::string Response::header(std::string_view name) const {
  for (const Header& h : headers)
    if (iequals(h.name, name)) return h.value;
  return {};
}

void Response::set_content(std::string content, std::string content_type) {
  body = std::move(content);
  set_header("Content-Type", std::move(content_type));
}

std::string decode_path(std::string_view target) {
  target = target.substr(0, target.find('?'));
  std::string out;
  out.reserve(target.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < target.size(); ++i) {
    if (target[i] == '%' && i + 2 < target.size() && hex(target[i + 1]) >= 0 &&
        hex(target[i + 2]) >= 0) {
      out += char(hex(target[i + 1]) * 16 + hex(target[i + 2]));
      i += 2;
    } else {
      out += target[i];
    }
  }
  return out;
}

// ---- the transport ---------------------------------------------------------------------------

struct Transport::Impl {
  TransportOptions o;
  TransportHooks hooks;
  // closing: stop() was asked: no new connections or requests, answers under way finish (up to
  // drain_timeout). stopping: the end: handlers give up (Connection::gone), the loop ends.
  std::atomic<bool> closing{false}, stopping{false};
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> busy{0};           // connections with an answer under way (an exchange)
  std::atomic<int64_t> body_reserved{0};  // bytes of request bodies being read or handled
  std::atomic<int64_t> refused{0}, timed_out{0}, streams_cut{0};  // TransportCounters
  // Every session, so that stop can break the cycle of one whose answer never finished.
  std::mutex sessions_mu;
  std::vector<std::weak_ptr<class SessionBase>> sessions;
  std::mutex clients_mu;
  std::map<std::string, int64_t> per_client;  // open connections per remote address
  int bound_port = -1;
  WorkerPool pool;
  std::optional<ssl::context> tls;
  // Declared last, destroyed first: the sessions its handlers hold use the members above.
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer accept_retry{ioc};
  asio::steady_timer drain_timer{ioc};
  std::chrono::steady_clock::time_point last_accept_warning{};

  Impl(TransportOptions opt, TransportHooks h) : o(std::move(opt)), hooks(std::move(h)) {}

  void accept();
  void on_accept(error_code ec, tcp::socket s);
  void refuse_connection(tcp::socket s, const std::string& why);
  // A handler's run on a worker: the answer into the exchange.
  void run_handler(Request& req, const std::shared_ptr<Exchange>& ex, bool keep_alive);
  void log(const Request* req, const Response& res) {
    try {
      if (req && hooks.log) hooks.log(*req, res);
    } catch (...) {
    }
  }
  // stop(): on the I/O thread, ends the loop once no answer is under way (or the deadline).
  void drain_then_stop(std::chrono::steady_clock::time_point deadline);
};

// What stop() needs of a session: dropping its answer, if one is still held.
class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual void abandon() = 0;
};

namespace {

tcp::socket& lowest(tcp::socket& s) {
  return s;
}
tcp::socket& lowest(ssl::stream<tcp::socket>& s) {
  return s.next_layer();
}

// One connection, on the I/O thread only. It is kept alive by its pending operations.
template <class Stream>
class Session final : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

 public:
  Session(Transport::Impl& t, Stream s, std::string addr, int port)
      : t_(t), stream_(std::move(s)), timer_(t.ioc), addr_(std::move(addr)), port_(port) {
    t_.live.fetch_add(1);
    std::lock_guard<std::mutex> lock(t_.clients_mu);
    ++t_.per_client[addr_];
  }
  ~Session() {
    t_.live.fetch_sub(1);
    std::lock_guard<std::mutex> lock(t_.clients_mu);
    if (auto it = t_.per_client.find(addr_); it != t_.per_client.end() && --it->second <= 0)
      t_.per_client.erase(it);
  }

  void start() {
    {
      std::lock_guard<std::mutex> lock(t_.sessions_mu);
      if (t_.sessions.size() > 64 && t_.sessions.size() > 2 * std::size_t(t_.live.load()))
        std::erase_if(t_.sessions, [](const auto& w) { return w.expired(); });
      t_.sessions.push_back(this->weak_from_this());
    }
    if constexpr (kTls) {
      arm(t_.o.header_timeout);
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](error_code ec) {
                                if (ec) return self->close();
                                self->read_request();
                              });
    } else {
      read_request();
    }
  }

 private:
  // One deadline at a time; a fired one closes the socket (pending operations then complete
  // with operation_aborted and find the session closed).
  void arm(std::chrono::milliseconds d) {
    const uint64_t gen = ++timer_gen_;
    timer_.expires_after(d);
    timer_.async_wait([self = this->shared_from_this(), gen](error_code ec) {
      if (ec || gen != self->timer_gen_) return;
      self->t_.timed_out.fetch_add(1);
      self->close();
    });
  }
  void disarm() {
    ++timer_gen_;
    timer_.cancel();
  }

  // The server stops and this session's answer never finished: its exchange (which holds the
  // session) is dropped, so neither outlives the transport.
  void abandon() override {
    if (ex_) ex_->detach();
    drop_exchange();
  }

  void read_request() {
    if (t_.closing.load()) return close();
    req_ = Request{};
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(t_.o.max_header_bytes));
    parser_->body_limit(t_.o.max_body_bytes);
    arm(t_.o.header_timeout);
    bhttp::async_read_header(
        stream_, buf_, *parser_,
        [self = this->shared_from_this()](error_code ec, std::size_t) { self->on_header(ec); });
  }

  void on_header(error_code ec) {
    disarm();
    if (ec == bhttp::error::header_limit)
      return refuse(
          431, fmt::format("request headers too large: more than {} bytes (at most {} "
                           "lines and {} bytes)",
                           t_.o.max_header_bytes, t_.o.max_header_lines, t_.o.max_header_bytes));
    if (ec == bhttp::error::body_limit)  // a Content-Length over the limit: refused unread
      return refuse(413, fmt::format("request body of {} bytes is larger than {} bytes "
                                     "(--max-body-mb)",
                                     parser_->content_length().value_or(0), t_.o.max_body_bytes));
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || closed_) return close();
    if (ec) {
      if (ec == bhttp::error::partial_message || ec == asio::error::connection_reset ||
          ec == ssl::error::stream_truncated)  // (a TLS peer gone without close_notify)
        return close();
      return refuse(400, "malformed HTTP request: " + ec.message());
    }
    auto& m = parser_->get();
    // The routes' regular expressions recurse per character: a path of tens of KB would exhaust
    // the stack. (cpp-httplib refused request lines over 8 KB too.)
    if (m.target().size() > kMaxTarget)
      return refuse(414, fmt::format("request target of {} bytes is longer than {} bytes",
                                     m.target().size(), kMaxTarget));
    req_ = Request{};
    req_.method = std::string(m.method_string());
    req_.target = std::string(m.target());
    req_.path = decode_path(req_.target);
    req_.version = m.version() == 10 ? 10 : 11;
    for (const auto& f : m)
      req_.headers.push_back({std::string(f.name_string()), std::string(f.value())});
    req_.remote_addr = addr_;
    req_.remote_port = port_;
    keep_alive_ = m.keep_alive();
    const bool body_pending = !parser_->is_done();
    if (req_.headers.size() > t_.o.max_header_lines)
      return refuse(431,
                    fmt::format("request headers too large: {} lines (at most {} lines and {} "
                                "bytes)",
                                req_.headers.size(), t_.o.max_header_lines, t_.o.max_header_bytes));
    if (t_.hooks.screen) {
      std::optional<Response> early;
      try {
        early = t_.hooks.screen(req_);
      } catch (const std::exception& e) {
        return refuse(500, std::string("internal error: ") + e.what());
      }
      // A body it announced is never read: the connection ends after the answer.
      if (early) return answer_now(std::move(*early), body_pending);
    }
    if (!body_pending) return dispatch();
    // Bodies held at once are bounded as a whole (each connection could hold --max-body-mb).
    const int64_t need = int64_t(parser_->content_length().value_or(t_.o.max_body_bytes));
    if (t_.body_reserved.load() + need > int64_t(t_.o.max_body_buffer_bytes))
      return refuse(503,
                    fmt::format("the server holds {} MB of request bodies (at most {} MB); "
                                "retry shortly",
                                t_.body_reserved.load() >> 20, t_.o.max_body_buffer_bytes >> 20));
    t_.body_reserved.fetch_add(need);
    reserved_ = need;
    if (req_.version == 11 && iequals(req_.header("Expect"), "100-continue")) {
      interim_ = "HTTP/1.1 100 Continue\r\n\r\n";
      arm(t_.o.write_timeout);
      return asio::async_write(stream_, asio::buffer(interim_),
                               [self = this->shared_from_this()](error_code e, std::size_t) {
                                 self->disarm();
                                 if (e) return self->close();
                                 self->read_body();
                               });
    }
    read_body();
  }

  void read_body() {
    arm(t_.o.body_timeout);
    bhttp::async_read(
        stream_, buf_, *parser_,
        [self = this->shared_from_this()](error_code ec, std::size_t) { self->on_body(ec); });
  }

  void on_body(error_code ec) {
    disarm();
    if (ec == bhttp::error::body_limit)
      return refuse(413, fmt::format("request body larger than {} bytes (--max-body-mb)",
                                     t_.o.max_body_bytes));
    if (ec == bhttp::error::partial_message || ec == asio::error::eof || closed_) return close();
    if (ec) return refuse(400, "malformed HTTP request body: " + ec.message());
    req_.body = std::move(parser_->get().body());
    dispatch();
  }

  // The transport's own refusal: an error answer, then the connection closes.
  void refuse(int status, const std::string& message) {
    if (closed_) return;
    release_body();
    Response r;
    try {
      r = t_.hooks.error(status, message, req_.path);
    } catch (...) {
      r.status = status;
      r.set_content(message, "text/plain");
    }
    if (status == 503) r.set_header("Retry-After", "1");
    answer_now(std::move(r), true);
  }
  void release_body() {
    t_.body_reserved.fetch_sub(reserved_);
    reserved_ = 0;
  }
  void drop_exchange() {
    if (ex_) t_.busy.fetch_sub(1);
    ex_.reset();  // (it holds this session: see make_exchange)
  }

  std::shared_ptr<Exchange> make_exchange() {
    auto ex = std::make_shared<Exchange>(t_.o.stream_buffer_bytes, t_.stopping,
                                         int(lowest(stream_).native_handle()),
                                         fmt::format("{}:{}", addr_, port_), t_.streams_cut);
    // The exchange keeps its session alive while a worker holds it (no socket operation may be
    // pending meanwhile); the session drops the exchange when the answer is out or it closes.
    auto self = this->shared_from_this();
    asio::io_context* ioc = &t_.ioc;
    ex->kick = [self, ioc] { asio::post(*ioc, [self] { self->drain(); }); };
    t_.busy.fetch_add(1);
    return ex;
  }

  // An answer made on the I/O thread (a refusal): no worker.
  void answer_now(Response r, bool close) {
    ex_ = make_exchange();
    const bool head = req_.method == "HEAD";
    close = close || !keep_alive_ || iequals(r.header("Connection"), "close");
    unread_body_ = close;
    ex_->put(serialize_head(r, req_.version, close, r.body.size(), false, t_.o.keep_alive_timeout) +
             (head ? "" : r.body));
    ex_->finish(close);
    t_.log(req_.method.empty() ? nullptr : &req_, r);
  }

  void dispatch() {
    unread_body_ = false;
    ex_ = make_exchange();
    t_.pool.post(
        [&t = t_, ex = ex_, req = std::move(req_), keep = keep_alive_, body = reserved_]() mutable {
          t.run_handler(req, ex, keep);
          req = Request{};
          t.body_reserved.fetch_sub(body);
        });
    reserved_ = 0;  // (the task releases it)
  }

  // Moves what the handler produced to the socket, one write at a time.
  void drain() {
    if (!ex_ || writing_ || closed_) return;
    Exchange::Taken tk = ex_->take();
    if (tk.failed) return close();
    if (!tk.bytes.empty()) {
      out_ = std::move(tk.bytes);
      writing_ = true;
      arm(t_.o.write_timeout);
      asio::async_write(stream_, asio::buffer(out_),
                        [self = this->shared_from_this()](error_code ec, std::size_t) {
                          self->writing_ = false;
                          self->disarm();
                          if (ec) return self->close();
                          self->drain();
                        });
      return;
    }
    if (tk.finished) answered(tk.close);
  }

  // The answer is out: the next request on this connection, or its end.
  void answered(bool close) {
    drop_exchange();
    out_.clear();
    out_.shrink_to_fit();
    // An idle connection keeps a few KB, whatever its last request needed.
    if (buf_.size() == 0) buf_.shrink_to_fit();
    if (close || !keep_alive_ || t_.closing.load()) return finish_connection();
    if (buf_.size() > 0) return read_request();  // a pipelined request is already here
    arm(t_.o.keep_alive_timeout);
    stream_.async_read_some(buf_.prepare(4096),
                            [self = this->shared_from_this()](error_code ec, std::size_t n) {
                              self->disarm();
                              if (ec) return self->close();
                              self->buf_.commit(n);
                              self->read_request();
                            });
  }

  // Connection: close. The sending side ends after the answer; a body we refused to read is
  // drained (and dropped) for a moment so that closing does not reset the connection before the
  // client read the answer.
  void finish_connection() {
    if constexpr (kTls) {
      arm(std::chrono::milliseconds(1000));
      stream_.async_shutdown([self = this->shared_from_this()](error_code) { self->close(); });
    } else {
      error_code ec;
      lowest(stream_).shutdown(tcp::socket::shutdown_send, ec);
      if (!unread_body_ || ec) return close();
      arm(std::chrono::milliseconds(2000));
      scratch_ = std::make_unique<std::array<char, 16384>>();
      linger();
    }
  }
  void linger() {
    lowest(stream_).async_read_some(
        asio::buffer(*scratch_), [self = this->shared_from_this()](error_code ec, std::size_t n) {
          self->lingered_ += n;
          if (ec || self->lingered_ > (64u << 20)) return self->close();
          self->linger();
        });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    disarm();
    release_body();
    if (ex_) ex_->detach();
    drop_exchange();
    error_code ec;
    lowest(stream_).shutdown(tcp::socket::shutdown_both, ec);
    lowest(stream_).close(ec);
  }

  Transport::Impl& t_;
  Stream stream_;
  asio::steady_timer timer_;
  uint64_t timer_gen_ = 0;
  std::string addr_;
  int port_;
  beast::flat_buffer buf_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Request req_;
  bool keep_alive_ = true;
  std::shared_ptr<Exchange> ex_;
  std::string out_, interim_;
  bool writing_ = false, closed_ = false, unread_body_ = false;
  std::size_t lingered_ = 0;
  std::unique_ptr<std::array<char, 16384>> scratch_;  // only while lingering
  int64_t reserved_ = 0;                              // this request's share of body_reserved
  static constexpr std::size_t kMaxTarget = 8192;
};

}  // namespace

void Transport::Impl::run_handler(Request& req, const std::shared_ptr<Exchange>& ex,
                                  bool keep_alive) {
  Response res;
  try {
    hooks.handle(req, res, *ex);
  } catch (const std::exception& e) {
    log::error("serve: internal error: {}", e.what());
    res = hooks.error(500, std::string("internal error: ") + e.what(), req.path);
  } catch (...) {
    res = hooks.error(500, "internal error", req.path);
  }
  const bool head = req.method == "HEAD";
  bool close = !keep_alive || iequals(res.header("Connection"), "close") || closing.load();
  if (!res.stream) {
    ex->put(serialize_head(res, req.version, close, res.body.size(), false, o.keep_alive_timeout) +
            (head ? std::string() : res.body));
    ex->finish(close);
    log(&req, res);
    return;
  }
  // HTTP/1.0 has no chunks: the stream's end is the connection's.
  ex->chunked = req.version >= 11;
  close = close || !ex->chunked;
  ex->put(serialize_head(res, req.version, close, std::nullopt, ex->chunked, o.keep_alive_timeout));
  if (close) ex->set_close();
  bool complete = false;
  try {
    while (!stopping.load() && !ex->finished())
      if (!res.stream(*ex)) break;
    complete = ex->finished() && !ex->failed();
  } catch (const std::exception& e) {
    log::error("serve: internal error in a stream: {}", e.what());
  } catch (...) {
    log::error("serve: internal error in a stream");
  }
  if (!complete) ex->abort();
  try {
    if (res.stream_end) res.stream_end(complete);
  } catch (...) {
    log::error("serve: internal error at a stream's end");
  }
  log(&req, res);
}

void Transport::Impl::accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket s) { on_accept(ec, std::move(s)); });
}

void Transport::Impl::on_accept(error_code ec, tcp::socket s) {
  if (ec == asio::error::operation_aborted || closing.load() || !acceptor.is_open()) return;
  if (ec) {
    // Out of file descriptors (or memory): wait a little rather than spin on the listener.
    const auto now = std::chrono::steady_clock::now();
    if (now - last_accept_warning > std::chrono::seconds(10)) {
      last_accept_warning = now;
      log::warn("serve: cannot accept connections: {} ({} open)", ec.message(), live.load());
    }
    accept_retry.expires_after(std::chrono::milliseconds(100));
    accept_retry.async_wait([this](error_code e) {
      if (!e) accept();
    });
    return;
  }
  accept();
  error_code e;
  const auto peer = s.remote_endpoint(e);
  if (e) return;
  std::string addr = peer.address().to_string();
  if (peer.address().is_v6() && peer.address().to_v6().is_v4_mapped())
    addr = asio::ip::make_address_v4(asio::ip::v4_mapped, peer.address().to_v6()).to_string();
  if (live.load() >= o.max_connections)
    return refuse_connection(
        std::move(s), fmt::format("{} connections are open (--max-connections)", live.load()));
  if (o.max_connections_per_client > 0) {
    int64_t n = 0;
    {
      std::lock_guard<std::mutex> lock(clients_mu);
      if (auto it = per_client.find(addr); it != per_client.end()) n = it->second;
    }
    if (n >= o.max_connections_per_client)
      return refuse_connection(
          std::move(s),
          fmt::format("{} connections from {} are open (--max-connections-per-client)", n, addr));
  }
  s.set_option(tcp::no_delay(true), e);  // SSE events go out as they are made
  if (tls) {
    std::make_shared<Session<ssl::stream<tcp::socket>>>(
        *this, ssl::stream<tcp::socket>(std::move(s), *tls), std::move(addr), peer.port())
        ->start();
  } else {
    std::make_shared<Session<tcp::socket>>(*this, std::move(s), std::move(addr), peer.port())
        ->start();
  }
}

// Over a connection cap: a 503 and the end of the connection, without reading the request. (On
// a TLS port there is no answer without a handshake: the connection just closes.)
void Transport::Impl::refuse_connection(tcp::socket s, const std::string& why) {
  if (refused.fetch_add(1) % 1000 == 0) log::warn("serve: connection refused: {}", why);
  if (tls) return;
  struct Refusal {
    tcp::socket s;
    std::string bytes;
    asio::steady_timer timer;
    std::array<char, 1024> sink;
    static void drain(const std::shared_ptr<Refusal>& r) {
      r->s.async_read_some(asio::buffer(r->sink), [r](error_code e, std::size_t) {
        if (!e) return drain(r);
        r->timer.cancel();
        error_code ec;
        r->s.close(ec);
      });
    }
  };
  Response r = hooks.error(503, "too many connections: " + why, "");
  r.set_header("Retry-After", "1");
  auto ref =
      std::make_shared<Refusal>(Refusal{std::move(s),
                                        serialize_head(r, 11, true, r.body.size(), false) + r.body,
                                        asio::steady_timer(ioc),
                                        {}});
  // The answer, the end of our side, then whatever the client sent is read and dropped for up to
  // a second: closing with unread bytes would reset the connection before it read the 503.
  ref->timer.expires_after(std::chrono::seconds(1));
  ref->timer.async_wait([ref](error_code e) {
    if (e) return;
    error_code ec;
    ref->s.close(ec);
  });
  asio::async_write(ref->s, asio::buffer(ref->bytes), [ref](error_code e, std::size_t) {
    error_code ec;
    if (e) {
      ref->timer.cancel();
      ref->s.close(ec);
      return;
    }
    ref->s.shutdown(tcp::socket::shutdown_send, ec);
    Refusal::drain(ref);
  });
}

Transport::Transport(TransportOptions options, TransportHooks hooks)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(hooks))) {}

Transport::~Transport() {
  stop();
}

Status Transport::bind() {
  Impl& t = *impl_;
  if (!t.o.ssl_certfile.empty()) {
    const std::string what = fmt::format(
        "--ssl-certfile {} / --ssl-keyfile {}: could not load the certificate and its key (PEM "
        "files; the key must match the certificate)",
        t.o.ssl_certfile, t.o.ssl_keyfile);
    try {
      t.tls.emplace(ssl::context::tls_server);
      t.tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                         ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                         ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
      t.tls->use_certificate_chain_file(t.o.ssl_certfile);
      t.tls->use_private_key_file(t.o.ssl_keyfile, ssl::context::pem);
      if (SSL_CTX_check_private_key(t.tls->native_handle()) != 1) {
        t.tls.reset();
        return Status::error(what);
      }
    } catch (const std::exception& e) {
      t.tls.reset();
      return Status::error(what + ": " + e.what());
    }
  }
  if (t.o.port < 0 || t.o.port > 65535)
    return Status::error(fmt::format("--port: {} is outside 0-65535 (0: any free port)", t.o.port));
  error_code ec;
  tcp::resolver resolver(t.ioc);
  auto found = resolver.resolve(t.o.host, std::to_string(t.o.port),
                                tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec)
    return Status::error(
        fmt::format("--host/--port: cannot listen on {}:{}: {}", t.o.host, t.o.port, ec.message()));
  error_code last;
  for (const auto& entry : found) {
    tcp::acceptor a(t.ioc);
    if (a.open(entry.endpoint().protocol(), last)) continue;
    a.set_option(asio::socket_base::reuse_address(true), last);
    if (a.bind(entry.endpoint(), last)) continue;
    if (a.listen(asio::socket_base::max_listen_connections, last)) continue;
    t.bound_port = a.local_endpoint().port();
    t.acceptor = std::move(a);
    return Status::ok();
  }
  std::string why = last.message();
  if (last == asio::error::address_in_use)
    why = "address in use (another server is listening there)";
  else if (last == boost::system::errc::address_not_available)
    why = "not a local address";
  else if (last == asio::error::access_denied)
    why = "permission denied (ports below 1024 need privileges)";
  return Status::error(
      fmt::format("--host/--port: cannot listen on {}:{}: {}", t.o.host, t.o.port, why));
}

int Transport::port() const {
  return impl_->bound_port;
}

TransportCounters Transport::counters() const {
  const Impl& t = *impl_;
  return {t.live.load(), t.refused.load(), t.timed_out.load(), t.streams_cut.load()};
}

void Transport::run() {
  Impl& t = *impl_;
  if (t.closing.load() || !t.acceptor.is_open()) return;
  t.pool.start(std::max(1, t.o.workers));
  t.accept();
  t.ioc.run();
  t.stopping.store(true);
  error_code ec;
  t.acceptor.close(ec);
  t.pool.stop_and_join();
  // Sessions whose answer did not finish within the drain hold themselves through their
  // exchange: break that, so that they go with the io_context.
  std::vector<std::shared_ptr<SessionBase>> left;
  {
    std::lock_guard<std::mutex> lock(t.sessions_mu);
    for (const auto& w : t.sessions)
      if (auto s = w.lock()) left.push_back(std::move(s));
    t.sessions.clear();
  }
  for (const auto& s : left) s->abandon();
}

void Transport::Impl::drain_then_stop(std::chrono::steady_clock::time_point deadline) {
  if (busy.load() == 0 || std::chrono::steady_clock::now() >= deadline) {
    stopping.store(true);
    ioc.stop();
    return;
  }
  drain_timer.expires_after(std::chrono::milliseconds(10));
  drain_timer.async_wait([this, deadline](error_code) { drain_then_stop(deadline); });
}

void Transport::stop() {
  Impl& t = *impl_;
  if (t.closing.exchange(true)) return;
  // No new connections; answers under way go out (kept connections close after theirs), then
  // the loop ends. (Before run(), run() returns at once.)
  const auto deadline = std::chrono::steady_clock::now() + t.o.drain_timeout;
  asio::post(t.ioc, [&t, deadline] {
    error_code ec;
    t.acceptor.close(ec);
    t.drain_then_stop(deadline);
  });
}

}  // namespace dsv41::http
