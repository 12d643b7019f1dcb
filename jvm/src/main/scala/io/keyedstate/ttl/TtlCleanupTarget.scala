package io.keyedstate.ttl

import io.keyedstate.rocks.LocalRocksDB

/**
 * What the cleanup strategies need of a loaded store: its database to scan, and writes that go
 * through the store's bookkeeping (changelog, exact key counts) like any other write. The
 * provider's loaded instance implements it; TTL knows nothing else about the provider.
 */
trait TtlCleanupTarget {
  def db: LocalRocksDB
  def isMultiValue(cf: String): Boolean
  def write(cf: String, key: Array[Byte], value: Array[Byte], merge: Boolean): Unit
  def delete(cf: String, key: Array[Byte]): Unit

  /** Runs `f` unless the store is closing (the background scan runs off the task thread). */
  def readGuarded[T](f: => T): Option[T]
  def isClosing: Boolean
}
