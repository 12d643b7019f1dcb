package io.keyedstate.checkpoint

import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.state.StateStoreId

/**
 * Bootstrapped state (docs/state-processor.md): version 0 of each store, the state a new query's
 * first batch starts from, written by the state processor under
 * `<checkpoint>/_keyedstate_bootstrap/state/<op>/<partition>[/<store>]`, beside the `state`
 * folder (Spark refuses to start a new query on a checkpoint whose `state` folder holds
 * anything). A store adopts it when its first batch loads version 0: the files and the manifest
 * are copied into the store, each file checked; a retried first batch adopts it again.
 */
object BootstrappedState {
  val Dir = "_keyedstate_bootstrap"

  /** The bootstrap state root of the checkpoint whose state root is `stateRoot`. */
  def stateRoot(checkpointRoot: Path): Path = new Path(new Path(checkpointRoot, Dir), "state")

  /** Where the bootstrapped version of store `id` is kept. */
  def storeDir(id: StateStoreId): Path = {
    val root = new Path(id.checkpointRootLocation).getParent
    new Path(StateStoreId(stateRoot(root).toString, id.operatorId, id.partitionId, id.storeName)
      .storeCheckpointLocation().toString)
  }

  /** Whether version 0 of `store` (store `id`) holds state, adopting the bootstrapped version first. */
  def adopt(store: CheckpointStore, id: StateStoreId): Boolean =
    store.hasManifest(0, None) || {
      val bootstrapped = new CheckpointStore(storeDir(id), store.hadoopConf)
      bootstrapped.hasManifest(0, None) && {
        val manifest = bootstrapped.readManifest(0, None)
        manifest.allFiles.foreach(f => bootstrapped.copyTo(f, 0, store))
        store.writeManifest(manifest, checkpointIdsEnabled = false)
        true
      }
    }
}
