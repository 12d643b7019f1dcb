package io.keyedstate.engine

import java.util.concurrent.ConcurrentHashMap

import io.keyedstate.TaskStateStore

/**
 * The lookup node opens a partition's store and the apply node, in the same task, writes and
 * commits it: the store is handed over by (task attempt, operator). Spark's own aggregation
 * hands its store from restore to save the same way.
 */
private[engine] object StoreHandoff {
  private val stores = new ConcurrentHashMap[(Long, Long), TaskStateStore]()

  def put(taskAttemptId: Long, operatorId: Long, store: TaskStateStore): Unit = stores.put((taskAttemptId, operatorId), store)

  def take(taskAttemptId: Long, operatorId: Long): TaskStateStore = {
    val store = stores.remove((taskAttemptId, operatorId))
    if (store == null) {
      throw new IllegalStateException(
        s"keyedstate: no state store opened for operator $operatorId in task attempt $taskAttemptId; " +
          "the lookup and apply nodes of a keyed function must run in one task")
    }
    store
  }

  def drop(taskAttemptId: Long, operatorId: Long): Unit = stores.remove((taskAttemptId, operatorId))
}
