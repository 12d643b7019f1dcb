package io.keyedstate.rocks

/** An iterator over native resources: exhausted or closed, it releases them. */
trait ClosableIterator[A] extends Iterator[A] with AutoCloseable

