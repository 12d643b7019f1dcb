package io.keyedstate.rocks

/** Byte arrays as RocksDB orders and merges keys and values. */
object KeyBytes {
  def startsWith(key: Array[Byte], prefix: Array[Byte]): Boolean =
    key.length >= prefix.length && java.util.Arrays.equals(key, 0, prefix.length, prefix, 0, prefix.length)

  /** The smallest key greater than every key starting with `prefix`, if there is one. */
  def prefixUpperBound(prefix: Array[Byte]): Option[Array[Byte]] = {
    var i = prefix.length - 1
    while (i >= 0 && (prefix(i) & 0xff) == 0xff) i -= 1
    if (i < 0) None
    else {
      val bound = java.util.Arrays.copyOf(prefix, i + 1)
      bound(i) = (bound(i) + 1).toByte
      Some(bound)
    }
  }

  /** `operands` merged onto `base` (the merge operator appends; no base: the operands alone). */
  def appended(base: Array[Byte], operands: Array[Byte]): Array[Byte] =
    if (base == null) operands
    else {
      val merged = java.util.Arrays.copyOf(base, base.length + operands.length)
      System.arraycopy(operands, 0, merged, base.length, operands.length)
      merged
    }
}
