package io.keyedstate.queryable

import java.net.InetSocketAddress
import java.nio.charset.StandardCharsets.UTF_8
import java.security.MessageDigest
import java.util.concurrent.{ExecutorService, RejectedExecutionException}

import com.sun.net.httpserver.{HttpExchange, HttpServer}

import io.keyedstate.checkpoint.Transfers

/**
 * The JDK's HTTP server as keyedstate's servers (the driver's query service, the executors'
 * state servers) run it: requests come to `serve` on the dispatcher thread, which answers what
 * needs no wait (a lookup of a view held here: tens of microseconds, less than handing the
 * request to another thread costs) and hands the rest to a pool of daemon handler threads
 * ([[Running.defer]]); the dispatcher never keeps a JVM alive; Nagle's algorithm is off.
 */
object HttpServers {
  /** A started server and the pool its deferred requests run on; stop both with [[stop]]. */
  final case class Running(server: HttpServer, handlers: ExecutorService) {
    def port: Int = server.getAddress.getPort

    /**
     * Runs `work` (which answers an exchange the dispatcher took) on a handler thread; when the
     * server is stopping, `refused` (which closes the exchange) on the calling thread instead.
     */
    def defer(work: => Unit)(refused: => Unit): Unit =
      try handlers.execute(() => work) catch { case _: RejectedExecutionException => refused }

    def stop(): Unit = {
      server.stop(0)
      handlers.shutdownNow()
    }
  }

  def start(host: String, port: Int, name: String, threads: Int)(serve: HttpExchange => Unit): Running = {
    // Without it a response's headers and body leave in two packets, and the second waits for
    // the client's delayed ACK of the first: 40 ms per request on Linux. Read once, when the
    // JDK's server configuration is first loaded: set before any server is created.
    System.setProperty("sun.net.httpserver.nodelay", "true")
    // Requests are read on the dispatcher thread: one that stalls (headers or body never
    // finished) is cut off after MaxRequestSeconds, an answer not taken after MaxResponseSeconds
    // (longer than the longest lookup wait), so no client holds the dispatcher for long.
    System.setProperty("sun.net.httpserver.maxReqTime", MaxRequestSeconds.toString)
    System.setProperty("sun.net.httpserver.maxRspTime", MaxResponseSeconds.toString)
    val server = HttpServer.create(new InetSocketAddress(host, port), 0)
    val handlers = Transfers.daemonPool(name, threads)
    server.createContext("/", (exchange: HttpExchange) => serve(exchange))
    server.setExecutor(null) // `serve` runs on the dispatcher thread, and defers what may wait
    // The dispatcher thread takes its daemon flag from the thread that starts it.
    val starter = new Thread(() => server.start(), s"$name-start")
    starter.setDaemon(true)
    starter.start()
    starter.join()
    Running(server, handlers)
  }

  private val MaxRequestSeconds = 5
  private val MaxResponseSeconds = 120

  /** Whether the request carries `Authorization: Bearer <token>`, compared in constant time. */
  def bearerIs(exchange: HttpExchange, token: String): Boolean = {
    val presented = Option(exchange.getRequestHeaders.getFirst("Authorization")).map(_.stripPrefix("Bearer ").trim)
      .getOrElse("")
    MessageDigest.isEqual(presented.getBytes(UTF_8), token.getBytes(UTF_8))
  }

  /** `host` as a URL's authority writes it (an IPv6 address in brackets). */
  def urlHost(host: String): String = if (host.contains(":") && !host.startsWith("[")) s"[$host]" else host
}
