package io.keyedstate

/**
 * How much of a search space the long tests explore. CI runs the `ci` scale; `make soak` sets
 * KEYEDSTATE_SOAK=1 for the full one (every file-system call of a fault-injected rescale, every
 * Lincheck iteration).
 */
object TestScale {
  val soak: Boolean = sys.env.get("KEYEDSTATE_SOAK").contains("1")

  /** `full` under `make soak`, `ci` otherwise. */
  def apply[T](ci: T, full: T): T = if (soak) full else ci
}
