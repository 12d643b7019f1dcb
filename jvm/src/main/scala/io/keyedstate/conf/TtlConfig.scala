package io.keyedstate.conf

import java.util.Locale

import io.keyedstate.errors.KeyedStateErrors

/** Flink's `StateTtlConfig.UpdateType`: which accesses restart an entry's time to live. */
sealed abstract class UpdateType(val name: String) extends Serializable
object UpdateType {
  case object OnCreateAndWrite extends UpdateType("OnCreateAndWrite")
  case object OnReadAndWrite extends UpdateType("OnReadAndWrite")
  val all: Seq[UpdateType] = Seq(OnCreateAndWrite, OnReadAndWrite)
}

/** Flink's `StateTtlConfig.StateVisibility`: whether an expired entry that is still stored is returned. */
sealed abstract class Visibility(val name: String) extends Serializable
object Visibility {
  case object NeverReturnExpired extends Visibility("NeverReturnExpired")
  case object ReturnExpiredIfNotCleanedUp extends Visibility("ReturnExpiredIfNotCleanedUp")
  val all: Seq[Visibility] = Seq(NeverReturnExpired, ReturnExpiredIfNotCleanedUp)
}

/** The clock entries are stamped and judged with: the batch's processing time or its watermark. */
sealed abstract class TimeCharacteristic(val name: String) extends Serializable
object TimeCharacteristic {
  case object ProcessingTime extends TimeCharacteristic("ProcessingTime")
  case object EventTime extends TimeCharacteristic("EventTime")
  val all: Seq[TimeCharacteristic] = Seq(ProcessingTime, EventTime)
}

/**
 * The resolved TTL of one column family of one operator. `durationMs = None` means no TTL
 * (entries are still stamped, so TTL can be switched on later for state written before).
 */
final case class TtlConfig(
    durationMs: Option[Long],
    updateType: UpdateType,
    visibility: Visibility,
    timeCharacteristic: TimeCharacteristic,
    cleanupFullSnapshot: Boolean,
    cleanupIncrementalSize: Int,
    cleanupIncrementalEveryRecord: Boolean,
    cleanupCompaction: Boolean,
    cleanupBackground: Boolean) {

  def enabled: Boolean = durationMs.isDefined

  /** Flink's overflow-safe `TtlUtils.expired`: `ts + ttl <= now`. */
  def expired(stamp: Long, now: Long): Boolean = durationMs.exists { ttl =>
    stamp + math.min(Long.MaxValue - stamp, ttl) <= now
  }

  def hidesExpired: Boolean = enabled && visibility == Visibility.NeverReturnExpired
  def refreshOnRead: Boolean = enabled && updateType == UpdateType.OnReadAndWrite
}

object TtlConfig {
  val Disabled: TtlConfig = TtlConfig(None, UpdateType.OnCreateAndWrite, Visibility.NeverReturnExpired,
    TimeCharacteristic.ProcessingTime, cleanupFullSnapshot = true, cleanupIncrementalSize = 0,
    cleanupIncrementalEveryRecord = false, cleanupCompaction = false, cleanupBackground = false)
}

/**
 * The `ttl.*` options: a default, per operator (`ttl.operator.<id>.<option>`) and per column
 * family of an operator (`ttl.operator.<id>.columnFamily.<name>.<option>`); the most specific
 * setting of each option wins. Parsing is strict, like every keyedstate option: an unknown option
 * or a bad value fails with the key, the value and what is allowed.
 */
final class TtlSettings private (
    defaults: Map[String, String],
    operators: Map[Long, Map[String, String]],
    columnFamilies: Map[(Long, String), Map[String, String]]) extends Serializable {

  /** The TTL of column family `cf` in operator `operatorId`. */
  def forColumnFamily(operatorId: Long, cf: String): TtlConfig = {
    val raw = defaults ++ operators.getOrElse(operatorId, Map.empty) ++
      columnFamilies.getOrElse((operatorId, cf), Map.empty)
    TtlSettings.resolve(raw)
  }

  /** Whether any column family of the operator may have a TTL (used to refuse join stores). */
  def anyEnabledFor(operatorId: Long, cf: String): Boolean =
    forColumnFamily(operatorId, cf).enabled ||
      columnFamilies.exists { case ((op, _), m) => op == operatorId && m.get("duration").exists(TtlSettings.isOn) }

  /** Whether anything is configured at all (no TTL: reads skip every expiry check). */
  val isEmpty: Boolean = defaults.isEmpty && operators.isEmpty && columnFamilies.isEmpty
}

object TtlSettings {
  val Prefix = "ttl."

  private final case class Opt(name: String, allowed: String, valid: String => Boolean)

  private def choice(values: Seq[String]): String => Boolean =
    v => values.exists(_.equalsIgnoreCase(v.trim))
  private val isBool: String => Boolean = v => v.trim.toLowerCase(Locale.ROOT).toBooleanOption.isDefined

  private val options: Seq[Opt] = Seq(
    Opt("duration", "a positive duration such as 30 minutes, 10s, 1500 (milliseconds), or none",
      v => v.trim.equalsIgnoreCase("none") || parseDurationMs(v).exists(_ > 0)),
    Opt("updateType", UpdateType.all.map(_.name).mkString("one of ", ", ", ""), choice(UpdateType.all.map(_.name))),
    Opt("visibility", Visibility.all.map(_.name).mkString("one of ", ", ", ""), choice(Visibility.all.map(_.name))),
    Opt("timeCharacteristic", TimeCharacteristic.all.map(_.name).mkString("one of ", ", ", ""),
      choice(TimeCharacteristic.all.map(_.name))),
    Opt("cleanup.fullSnapshot", "true or false", isBool),
    Opt("cleanup.incremental.size", "an integer from 0 to 1000000",
      v => v.trim.toIntOption.exists(n => n >= 0 && n <= 1000000)),
    Opt("cleanup.incremental.everyRecord", "true or false", isBool),
    Opt("cleanup.compaction", "true or false", isBool),
    Opt("cleanup.background", "true or false", isBool))

  val optionNames: Seq[String] = options.map(_.name)

  private def isOn(raw: String): Boolean = !raw.trim.equalsIgnoreCase("none")

  private val units: Seq[(Seq[String], Long)] = Seq(
    Seq("ms", "milli", "millis", "millisecond", "milliseconds") -> 1L,
    Seq("s", "sec", "secs", "second", "seconds") -> 1000L,
    Seq("m", "min", "mins", "minute", "minutes") -> 60000L,
    Seq("h", "hour", "hours") -> 3600000L,
    Seq("d", "day", "days") -> 86400000L)
  private val DurationPattern = """(\d+)\s*([a-zA-Z]*)""".r

  /** `30 minutes`, `10s`, `1h`, `1500` (milliseconds). */
  def parseDurationMs(raw: String): Option[Long] = raw.trim match {
    case DurationPattern(n, unit) =>
      val factor =
        if (unit.isEmpty) Some(1L)
        else units.collectFirst { case (names, f) if names.contains(unit.toLowerCase(Locale.ROOT)) => f }
      for {
        f <- factor
        v <- n.toLongOption
        if v <= Long.MaxValue / f
      } yield v * f
    case _ => None
  }

  /**
   * `settings` are the `ttl.*` options with the `spark.sql.streaming.stateStore.keyedstate.`
   * prefix stripped (`fullPrefix` is put back in error messages).
   */
  def parse(settings: Map[String, String], fullPrefix: String): TtlSettings = {
    val defaults = Map.newBuilder[String, String]
    val operators = scala.collection.mutable.Map[Long, Map[String, String]]()
    val cfs = scala.collection.mutable.Map[(Long, String), Map[String, String]]()
    def unknown(key: String): Nothing = throw KeyedStateErrors.invalidOption(
      s"Unknown keyedstate option $fullPrefix$key; TTL options are $fullPrefix$Prefix<option>, " +
        s"$fullPrefix${Prefix}operator.<operatorId>.<option> and " +
        s"$fullPrefix${Prefix}operator.<operatorId>.columnFamily.<name>.<option>, where <option> is one of " +
        optionNames.mkString(", "))
    def checked(key: String, option: String, raw: String): (String, String) = {
      val opt = options.find(_.name == option).getOrElse(unknown(key))
      if (!opt.valid(raw)) {
        throw KeyedStateErrors.invalidOptionValue(fullPrefix + key, raw, opt.allowed)
      }
      option -> raw
    }
    settings.toSeq.sortBy(_._1).foreach { case (key, raw) =>
      val rest = key.stripPrefix(Prefix)
      if (rest.startsWith("operator.")) {
        val afterOp = rest.stripPrefix("operator.")
        val dot = afterOp.indexOf('.')
        val opId = if (dot > 0) afterOp.substring(0, dot).toLongOption.filter(_ >= 0) else None
        val tail = if (dot > 0) afterOp.substring(dot + 1) else ""
        opId match {
          case None => unknown(key)
          case Some(op) if tail.startsWith("columnFamily.") =>
            // Column family names may contain dots: the option is the longest known suffix.
            val cfAndOpt = tail.stripPrefix("columnFamily.")
            val option = optionNames.filter(n => cfAndOpt.endsWith("." + n)).sortBy(-_.length).headOption
              .getOrElse(unknown(key))
            val cf = cfAndOpt.dropRight(option.length + 1)
            if (cf.isEmpty) unknown(key)
            cfs((op, cf)) = cfs.getOrElse((op, cf), Map.empty) + checked(key, option, raw)
          case Some(op) =>
            operators(op) = operators.getOrElse(op, Map.empty) + checked(key, tail, raw)
        }
      } else defaults += checked(key, rest, raw)
    }
    new TtlSettings(defaults.result(), operators.toMap, cfs.toMap)
  }

  private def bool(raw: String): Boolean = raw.trim.toLowerCase(Locale.ROOT).toBoolean
  private def pick[T](all: Seq[T], name: T => String, raw: String): T =
    all.find(t => name(t).equalsIgnoreCase(raw.trim)).get

  private def resolve(raw: Map[String, String]): TtlConfig = {
    val d = TtlConfig.Disabled
    TtlConfig(
      durationMs = raw.get("duration").filter(isOn).flatMap(parseDurationMs),
      updateType = raw.get("updateType").map(pick[UpdateType](UpdateType.all, _.name, _)).getOrElse(d.updateType),
      visibility = raw.get("visibility").map(pick[Visibility](Visibility.all, _.name, _)).getOrElse(d.visibility),
      timeCharacteristic = raw.get("timeCharacteristic")
        .map(pick[TimeCharacteristic](TimeCharacteristic.all, _.name, _)).getOrElse(d.timeCharacteristic),
      cleanupFullSnapshot = raw.get("cleanup.fullSnapshot").map(bool).getOrElse(d.cleanupFullSnapshot),
      cleanupIncrementalSize = raw.get("cleanup.incremental.size").map(_.trim.toInt).getOrElse(d.cleanupIncrementalSize),
      cleanupIncrementalEveryRecord =
        raw.get("cleanup.incremental.everyRecord").map(bool).getOrElse(d.cleanupIncrementalEveryRecord),
      cleanupCompaction = raw.get("cleanup.compaction").map(bool).getOrElse(d.cleanupCompaction),
      cleanupBackground = raw.get("cleanup.background").map(bool).getOrElse(d.cleanupBackground))
  }

  val empty: TtlSettings = new TtlSettings(Map.empty, Map.empty, Map.empty)
}
