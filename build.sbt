// keyedstate: one sbt build for the Scala state store provider, one jar per Spark minor version.
//
// Each Spark minor version is compiled against that version's own jars: the root project against
// the jars of the installed `pyspark` wheel (see `sparkJarsDir`; override with
// KEYEDSTATE_SPARK_JARS=/path/to/spark/jars), the older ones (`spark40`, `spark41`, `spark42`) against the
// jars `make spark-jars` takes from their pyspark releases on PyPI (build/spark-jars/<version>/).
// What differs between versions lives in small shims, jvm/src/main/scala-spark-<minor>/, beside
// the common sources (docs/architecture.md, "Spark versions").
import scala.sys.process._

lazy val sparkJarsDir = settingKey[File]("Directory holding the Spark jars to compile (and test) against")
lazy val sparkMinor = settingKey[String]("The Spark minor version of sparkJarsDir's jars (4.0 to 4.3)")

ThisBuild / organization := "io.keyedstate"
ThisBuild / version := "0.1.0"
ThisBuild / scalaVersion := "2.13.18"

// The Spark minor versions keyedstate supports (also SparkVersionCheck.Supported and Python's
// SUPPORTED_SPARK; test_layout checks they agree); the root project builds the installed pyspark's.
lazy val supportedSparkMinors = Seq("4.0", "4.1", "4.2", "4.3")

// "4.2" from the spark-core jar of a Spark distribution's jars folder.
def sparkMinorOf(jars: File): String = {
  val Core = """spark-core_2\.13-(\d+)\.(\d+)\.\d+.*\.jar""".r
  if (!jars.isDirectory) sys.error(s"$jars does not exist (`make spark-jars` fetches the older Spark versions' jars)")
  val minors = Option(jars.listFiles).toSeq.flatten.map(_.getName).collect { case Core(major, minor) => s"$major.$minor" }
  minors.headOption.filter(supportedSparkMinors.contains).getOrElse(sys.error(
    s"$jars holds no spark-core jar of a supported Spark (${supportedSparkMinors.mkString(", ")}): found " +
      (if (minors.isEmpty) "none" else minors.mkString(", "))))
}

// A version's shim folders: scala-spark-<minor> (its own), and what several versions share:
// every scala-spark-<from>+ with <from> at or below it (e.g. 4.1+ for the packages Spark 4.1
// split) and every scala-spark-<from>-<to> around it (e.g. 4.0-4.1 for the store API before 4.2).
def shimFolders(main: File, minor: String): Seq[File] = {
  def number(v: String): (Int, Int) = v.split('.') match { case Array(a, b) => (a.toInt, b.toInt) }
  val at = Ordering[(Int, Int)]
  val From = """scala-spark-(\d+\.\d+)\+""".r
  val Range = """scala-spark-(\d+\.\d+)-(\d+\.\d+)""".r
  main / s"scala-spark-$minor" +: Option(main.listFiles).toSeq.flatten.sortBy(_.getName).filter(_.getName match {
    case From(from) => at.lteq(number(from), number(minor))
    case Range(from, to) => at.lteq(number(from), number(minor)) && at.lteq(number(minor), number(to))
    case _ => false
  })
}

// What every version's project shares: the common sources, its version's shims, Spark's jars.
def providerSettings: Seq[Setting[_]] = Seq(
  Compile / scalaSource := (ThisBuild / baseDirectory).value / "jvm" / "src" / "main" / "scala",
  Compile / unmanagedSourceDirectories ++= shimFolders((ThisBuild / baseDirectory).value / "jvm" / "src" / "main",
    sparkMinor.value),
  Compile / resourceDirectory := (ThisBuild / baseDirectory).value / "jvm" / "src" / "main" / "resources",
  // Spark, Hadoop and rocksdbjni are "provided": they come from the Spark installation.
  Compile / unmanagedJars := {
    val jars = sparkJarsDir.value
    val found = sparkMinorOf(jars)
    if (found != sparkMinor.value) sys.error(s"$jars holds Spark $found's jars, not ${sparkMinor.value}'s")
    (jars ** "*.jar").classpath
  },
  // The Kafka sink's client (io.keyedstate.sinks): at runtime it comes with Spark's Kafka
  // connector (keyedstate.configure(kafka=True)), so compile against that very version.
  // Intransitive: its compression and logging jars are Spark's already.
  libraryDependencies += ("org.apache.kafka" % "kafka-clients" % "3.9.2" % Provided).intransitive(),
  scalacOptions ++= Seq("-deprecation", "-feature", "-unchecked", "-Xlint:-unused,_", "-release", "17"),
  javacOptions ++= Seq("--release", "17"),
  // The jar holds only our classes; Spark's jars are on the cluster already.
  Compile / packageBin / artifactPath := target.value / s"keyedstate-spark-${sparkMinor.value}.jar",
  assembly := (Compile / packageBin).value,
  // The jar into the Python package, where keyedstate.jar_path() picks the installed pyspark's.
  bundle := {
    val jar = assembly.value
    val bundled = (ThisBuild / baseDirectory).value / "python" / "keyedstate" / "jars" / jar.getName
    // Whole or not at all: a JVM starting meanwhile never reads half a jar.
    val staging = file(bundled.getPath + ".tmp")
    IO.copyFile(jar, staging)
    java.nio.file.Files.move(staging.toPath, bundled.toPath, java.nio.file.StandardCopyOption.ATOMIC_MOVE)
    streams.value.log.info(s"Bundled $bundled")
    bundled
  }
)

// An older Spark minor version's provider: `./dev/sbt spark42/package`.
def olderSpark(minor: String, scala: String = "2.13.18"): Project =
  Project(s"spark${minor.replace(".", "")}", file(s"target/projects/spark-$minor"))
    .settings(providerSettings)
    .settings(
      name := "keyedstate",
      sparkMinor := minor,
      // The Scala its Spark ships: sbt's scala-library would sit beside Spark's in the classpath.
      scalaVersion := scala,
      sparkJarsDir := (ThisBuild / baseDirectory).value / "build" / "spark-jars" / minor,
      target := (ThisBuild / baseDirectory).value / "target" / s"spark-$minor"
    )

lazy val spark40 = olderSpark("4.0", scala = "2.13.16")
lazy val spark41 = olderSpark("4.1", scala = "2.13.17")
lazy val spark42 = olderSpark("4.2")

// The installed pyspark's Spark (4.3 in development), with the Scala suites.
lazy val root = (project in file("."))
  .settings(providerSettings)
  .settings(
    name := "keyedstate",
    sparkMinor := sparkMinorOf(sparkJarsDir.value),
    sparkJarsDir := {
      sys.env.get("KEYEDSTATE_SPARK_JARS").map(file).getOrElse {
        val py = sys.env.getOrElse("PYTHON", "python3")
        val dir = Seq(py, "-c", "import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), 'jars'))").!!.trim
        file(dir)
      }
    },
    Test / scalaSource := baseDirectory.value / "jvm" / "src" / "test" / "scala",
    Test / resourceDirectory := baseDirectory.value / "jvm" / "src" / "test" / "resources",
    // JVM microbenchmarks (bench/jvm) build with the tests: `Test/runMain io.keyedstate.bench.<Name>`.
    Test / unmanagedSourceDirectories += baseDirectory.value / "bench" / "jvm",
    libraryDependencies += "org.scalatest" %% "scalatest" % "3.2.19" % Test,
    // Linearizability checks of the store's concurrent operations (rocks.LinearizabilitySuite).
    libraryDependencies += "org.jetbrains.kotlinx" % "lincheck-jvm" % "2.39" % Test,
    // Spark needs these opens on Java 17 (the same list spark-submit passes).
    Test / fork := true,
    Test / javaOptions ++= Seq(
      "-Xmx4g",
      "--add-opens=java.base/java.lang=ALL-UNNAMED",
      "--add-opens=java.base/java.lang.invoke=ALL-UNNAMED",
      "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
      "--add-opens=java.base/java.io=ALL-UNNAMED",
      "--add-opens=java.base/java.net=ALL-UNNAMED",
      "--add-opens=java.base/java.nio=ALL-UNNAMED",
      "--add-opens=java.base/java.util=ALL-UNNAMED",
      "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
      "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
      "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
      "--add-opens=java.base/sun.nio.cs=ALL-UNNAMED",
      "--add-opens=java.base/sun.security.action=ALL-UNNAMED",
      "--add-opens=java.base/sun.util.calendar=ALL-UNNAMED",
      "-Djdk.reflect.useDirectMethodHandle=false",
      "-Dio.netty.tryReflectionSetAccessible=true"
    ),
    Test / parallelExecution := false,
    // Lincheck instruments classes through a Java agent, which fails on classes other suites have
    // loaded already: its suites run in a JVM of their own.
    Test / testGrouping := {
      val (lincheck, rest) = (Test / definedTests).value.partition(_.name.endsWith("LinearizabilitySuite"))
      val fork = Tests.SubProcess(ForkOptions().withRunJVMOptions((Test / javaOptions).value.toVector))
      Seq(Tests.Group("suites", rest, fork), Tests.Group("lincheck", lincheck, fork)).filter(_.tests.nonEmpty)
    },
    Test / testOptions += Tests.Argument(TestFrameworks.ScalaTest, "-oD")
  )

lazy val assembly = taskKey[File]("The provider jar to ship (our classes only)")
lazy val bundle = taskKey[File]("The provider jar, copied into the Python package (python/keyedstate/jars/)")
