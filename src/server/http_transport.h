// The HTTP/1.1 transport under the API server: event-driven connections on one I/O thread
// (Boost.Asio; Boost.Beast's request parser), TLS (OpenSSL), per-phase deadlines, caps on open
// connections, and bounded response buffers. It knows nothing of the APIs: a request whose headers
// passed `screen` and whose body was read is handed to `handle` on a worker thread; the answer,
// whole or streamed by that worker, goes back to the socket through a bounded outbox. An open
// connection costs memory (its buffers), never a thread: only a request being handled holds a
// worker (docs/decisions.md, "The network layer").
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dsv41::http {

struct Header {
  std::string name, value;
};

struct Request {
  std::string method, target;
  std::string path;  // the target before '?', percent-decoded
  int version = 11;  // 10 (HTTP/1.0) or 11
  std::vector<Header> headers;
  std::string body;
  std::string remote_addr;
  int remote_port = 0;
  std::vector<std::string>
      matches;  // the route's captures ([0]: the whole path); set by the router
  bool has_header(std::string_view name) const;  // names compare case-insensitively
  std::string header(std::string_view name, std::size_t k = 0) const;  // "" when absent
  std::size_t header_count(std::string_view name) const;
};

// Where a streamed answer's bytes go (chunked framing is the transport's). Thread-safe and never
// blocks: bytes the client has not taken yet wait in the outbox up to its limit; past it the
// stream is cut (the connection closes, with a logged reason) and every later write fails.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  virtual bool write(std::string_view data) = 0;  // false: the client is gone or was cut
  virtual void done() = 0;                        // the answer is complete
};

// What a handler may learn about its connection while it works.
class Connection {
 public:
  virtual ~Connection() = default;
  // The client hung up (a read saw the end of its side, or a write failed), its stream was cut,
  // or the server is stopping.
  virtual bool gone() const = 0;
};

struct Response {
  int status = 200;
  std::vector<Header> headers;
  std::string body;
  // A streamed answer (chunked on HTTP/1.1): the worker calls `stream` until it returns false
  // (the client is gone: the connection closes) or it called sink.done(); then `stream_end` once,
  // with whether the answer went out whole.
  std::function<bool(StreamSink&)> stream;
  std::function<void(bool complete)> stream_end;

  void set_header(std::string name, std::string value);  // replaces a header of that name
  void erase_header(std::string_view name);
  bool has_header(std::string_view name) const;
  std::string header(std::string_view name) const;
  void set_content(std::string content, std::string content_type);
};

struct TransportOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                                     // 0: any free port
  std::string ssl_certfile, ssl_keyfile;               // both set: HTTPS
  int workers = 16;                                    // threads that run handlers
  std::size_t max_body_bytes = 8u << 20;               // whatever the framing (413 past it)
  std::size_t max_header_bytes = 64 * 1024;            // request line and headers (431 past it)
  std::size_t max_header_lines = 200;                  // header fields (431 past it)
  int64_t max_connections = 10000;                     // open at once (503 and close beyond)
  int64_t max_connections_per_client = 0;              // per remote address; 0: no cap
  std::chrono::milliseconds header_timeout{10000};     // to read a request's headers (slowloris)
  std::chrono::milliseconds body_timeout{60000};       // to read its body
  std::chrono::milliseconds keep_alive_timeout{5000};  // idle between requests
  std::chrono::milliseconds write_timeout{30000};      // for one write to make progress
  std::size_t stream_buffer_bytes = 1u << 20;  // a response's bytes waiting for a slow reader
  std::size_t max_body_buffer_bytes = std::size_t(1) << 30;  // all bodies held at once (503)
  std::chrono::milliseconds drain_timeout{5000};  // stop(): for answers under way to go out
};

struct TransportHooks {
  // On the I/O thread, once the headers are in (the body is not read yet): an answer refuses the
  // request at once (a body it announced is never read: the connection closes after the answer);
  // nullopt reads the body and dispatches. Must not block.
  std::function<std::optional<Response>(const Request&)> screen;
  // On a worker thread: the answer. Exceptions become a 500 (from `error`).
  std::function<void(Request&, Response&, const Connection&)> handle;
  // The transport's own refusals (400 malformed, 413, 414, 431, 500, 503 over the
  // connection cap) in the API's error shape; `path` is "" when the request line was unreadable.
  std::function<Response(int status, const std::string& message, const std::string& path)> error;
  // After each answer was handed to the socket (a stream: when it ended).
  std::function<void(const Request&, const Response&)> log;
};

// What the transport has done, for /metrics.
struct TransportCounters {
  int64_t open = 0;         // connections open now
  int64_t refused = 0;      // connections refused over a cap (503 or closed)
  int64_t timed_out = 0;    // connections closed at a deadline (headers, body, idle, a write)
  int64_t streams_cut = 0;  // streamed answers cut for a reader too slow for the buffer
};

class Transport {
 public:
  Transport(TransportOptions options, TransportHooks hooks);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  Status bind();  // loads the TLS files and binds host:port (errors name them)
  int port() const;
  void run();  // the I/O loop on this thread, until stop(); then waits for the workers
  // Thread-safe, idempotent, also before run() (which then returns at once): no new connections
  // or requests; answers under way are written (up to drain_timeout), then run() returns.
  void stop();
  TransportCounters counters() const;

  struct Impl;  // (public for the connection objects of the .cpp; opaque)

 private:
  std::unique_ptr<Impl> impl_;
};

// Percent-decoding of a request path (%41 -> 'A'; a malformed escape is kept as it is).
std::string decode_path(std::string_view target);

}  // namespace dsv41::http
