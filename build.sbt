// keyedstate: one sbt build for the Scala state store provider.
//
// Spark is compiled against the very jars of the installed `pyspark` wheel (see
// `sparkJarsDir`), so the provider is built for exactly the Spark the Python
// package runs. Override with KEYEDSTATE_SPARK_JARS=/path/to/spark/jars.
import scala.sys.process._

lazy val sparkJarsDir = settingKey[File]("Directory holding the Spark 4.3 jars to compile and test against")

ThisBuild / organization := "io.keyedstate"
ThisBuild / version := "0.1.0"
ThisBuild / scalaVersion := "2.13.18"

lazy val root = (project in file("."))
  .settings(
    name := "keyedstate",
    sparkJarsDir := {
      sys.env.get("KEYEDSTATE_SPARK_JARS").map(file).getOrElse {
        val py = sys.env.getOrElse("PYTHON", "python3")
        val dir = Seq(py, "-c", "import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), 'jars'))").!!.trim
        file(dir)
      }
    },
    Compile / scalaSource := baseDirectory.value / "jvm" / "src" / "main" / "scala",
    Compile / resourceDirectory := baseDirectory.value / "jvm" / "src" / "main" / "resources",
    Test / scalaSource := baseDirectory.value / "jvm" / "src" / "test" / "scala",
    Test / resourceDirectory := baseDirectory.value / "jvm" / "src" / "test" / "resources",
    // JVM microbenchmarks (bench/jvm) build with the tests: `Test/runMain io.keyedstate.bench.<Name>`.
    Test / unmanagedSourceDirectories += baseDirectory.value / "bench" / "jvm",
    // Spark, Hadoop and rocksdbjni are "provided": they come from the Spark installation.
    Compile / unmanagedJars := (sparkJarsDir.value ** "*.jar").classpath,
    libraryDependencies += "org.scalatest" %% "scalatest" % "3.2.19" % Test,
    // Linearizability checks of the store's concurrent operations (rocks.LinearizabilitySuite).
    libraryDependencies += "org.jetbrains.kotlinx" % "lincheck-jvm" % "2.39" % Test,
    // The Kafka sink's client (io.keyedstate.sinks): at runtime it comes with Spark's Kafka
    // connector (keyedstate.configure(kafka=True)), so compile against that very version.
    // Intransitive: its compression and logging jars are Spark's already.
    libraryDependencies += ("org.apache.kafka" % "kafka-clients" % "3.9.2" % Provided).intransitive(),
    scalacOptions ++= Seq("-deprecation", "-feature", "-unchecked", "-Xlint:-unused,_", "-release", "17"),
    javacOptions ++= Seq("--release", "17"),
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
    Test / testOptions += Tests.Argument(TestFrameworks.ScalaTest, "-oD"),
    // The jar holds only our classes; Spark's jars are on the cluster already.
    assembly := (Compile / packageBin).value
  )

lazy val assembly = taskKey[File]("The provider jar to ship (our classes only)")
