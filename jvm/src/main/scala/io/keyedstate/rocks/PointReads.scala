package io.keyedstate.rocks

import java.nio.ByteBuffer

import org.rocksdb.{ColumnFamilyHandle, KeyMayExist, RocksDB}

/** Point reads of a RocksDB column family that cost a missing key nothing extra. */
object PointReads {
  /**
   * A point read that does not pay for a missing key: rocksdbjni's `get` (every variant, 9.8)
   * throws and catches a C++ exception inside JNI on NotFound, costlier than the lookup itself.
   * `keyMayExist` looks in memtables and cached blocks only and answers without one: not there
   * (memtables and bloom filters rule the key out), or the value. Only a key that may be in blocks
   * not cached, or a value larger than the buffer (which then grows), is read again with `get`.
   * The direct-buffer variant, with buffers reused per thread, costs a found key about what `get`
   * does; the one returning the value in a `Holder` allocates three Java arrays per read.
   * `keyMayExist` reads no file, so the errors `get` would raise (I/O, corruption) come from the
   * `get` it falls back to.
   */
  private[keyedstate] def get(db: RocksDB, cf: ColumnFamilyHandle, key: Array[Byte]): Array[Byte] = {
    val buffers = readBuffers.get()
    val v = buffers.value
    v.clear()
    val found = db.keyMayExist(cf, null, buffers.keyFor(key), v)
    found.exists match {
      case KeyMayExist.KeyMayExistEnum.kNotExist => null
      case KeyMayExist.KeyMayExistEnum.kExistsWithValue if found.valueLength <= v.capacity =>
        val value = new Array[Byte](found.valueLength)
        v.get(value)
        value
      case KeyMayExist.KeyMayExistEnum.kExistsWithValue =>
        buffers.fitValues(found.valueLength)
        db.get(cf, key)
      case KeyMayExist.KeyMayExistEnum.kExistsWithoutValue => db.get(cf, key)
    }
  }

  /** Whether `key` exists: [[get]] without copying the value into a Java array. */
  private[keyedstate] def exists(db: RocksDB, cf: ColumnFamilyHandle, key: Array[Byte]): Boolean = {
    val buffers = readBuffers.get()
    val v = buffers.value
    v.clear()
    db.keyMayExist(cf, null, buffers.keyFor(key), v).exists match {
      case KeyMayExist.KeyMayExistEnum.kNotExist => false
      case KeyMayExist.KeyMayExistEnum.kExistsWithValue => true
      case KeyMayExist.KeyMayExistEnum.kExistsWithoutValue => db.get(cf, key) != null
    }
  }

  /** Direct buffers the JNI reads a key from and copies a value into (one pair per thread). */
  private final class ReadBuffers {
    private var key = ByteBuffer.allocateDirect(256)
    var value: ByteBuffer = ByteBuffer.allocateDirect(16 * 1024)

    def keyFor(bytes: Array[Byte]): ByteBuffer = {
      if (key.capacity < bytes.length) key = ByteBuffer.allocateDirect(bytes.length * 2)
      key.clear()
      key.put(bytes).flip()
    }

    /** Grows the value buffer so values of `length` bytes fit next time (up to 1 MiB). */
    def fitValues(length: Int): Unit = if (length <= MaxValueBuffer) {
      value = ByteBuffer.allocateDirect(math.min(MaxValueBuffer, math.max(length, value.capacity * 2)))
    }
  }
  private val MaxValueBuffer = 1024 * 1024
  private val readBuffers = ThreadLocal.withInitial[ReadBuffers](() => new ReadBuffers)
}
