package io.keyedstate.service

import org.apache.spark.sql.SparkSessionExtensions
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan

/**
 * Starts the application's [[QueryService]] when its first streaming query is analysed, and serves
 * the queries of each session that starts one: `spark.sql.extensions` names it beside
 * `io.keyedstate.engine.KeyedStateExtensions` (`keyedstate.configure` sets both).
 */
final class ServiceExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit =
    extensions.injectCheckRule(session => (plan: LogicalPlan) => if (plan.isStreaming) QueryService.installOn(session))
}
