import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeoutException;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.protocol.Block;
import org.apache.hadoop.hdfs.server.blockmanagement.BlockCollection;
import org.apache.hadoop.hdfs.server.blockmanagement.BlockInfo;
import org.apache.hadoop.hdfs.server.blockmanagement.DatanodeStorageInfo;
import org.apache.hadoop.hdfs.server.datanode.DataNode;
import org.apache.hadoop.hdfs.server.datanode.DataNodeFaultInjector;
import org.apache.hadoop.hdfs.server.namenode.FSNamesystem;

/**
 * Hadoop's MiniDFSCluster as its own process, for the storage tests
 * (tests/support/servers/hdfs_cluster.py starts it with `java -cp build/storage/hdfs-minicluster/*
 * dev/storage/MiniHdfs.java BASE_DIR DATANODES`, Java's single-file source launcher).
 *
 * Everything binds 127.0.0.1 on free ports. Once up it prints one line
 * {@code READY {"uri": ..., "http": ..., "datanodes": [...]}} on stdout, then serves commands, one
 * per stdin line, each answered by one line ({@code OK ...} or {@code ERROR ...}):
 * {@code stop-datanode N}, {@code restart-datanode N} (same ports and storage), {@code datanodes},
 * {@code hold-writes REGEX}, {@code await-held SECONDS}, {@code release-writes} (see {@link WriteHold}),
 * {@code shutdown}. End of stdin shuts the cluster down too, so it never outlives the tests.
 */
public final class MiniHdfs {
  private MiniHdfs() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 2) {
      System.err.println("usage: MiniHdfs BASE_DIR DATANODES");
      System.exit(2);
    }
    File base = new File(args[0]);
    int datanodes = Integer.parseInt(args[1]);

    Configuration conf = new Configuration();
    // Quick to notice a stopped datanode (outage tests): dead after 2 * recheck + 10 * heartbeat.
    conf.setLong("dfs.heartbeat.interval", 1);
    conf.setInt("dfs.namenode.heartbeat.recheck-interval", 2000);
    conf.setInt("dfs.namenode.safemode.extension", 0);
    // A 2-core test machine: few handler threads.
    conf.setInt("dfs.namenode.handler.count", 4);
    conf.setInt("dfs.datanode.handler.count", 2);
    conf.set("dfs.permissions.enabled", "false");

    MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf, base)
        .numDataNodes(datanodes)
        .format(true)
        .build();
    Map<Integer, MiniDFSCluster.DataNodeProperties> stopped = new HashMap<>();
    List<String> names = new ArrayList<>();
    List<Integer> xferPorts = new ArrayList<>();
    WriteHold hold = new WriteHold(cluster);
    DataNodeFaultInjector.set(hold);
    Runtime.getRuntime().addShutdownHook(new Thread(cluster::shutdown));
    try {
      cluster.waitActive();
      for (DataNode dn : cluster.getDataNodes()) {
        names.add(dn.getDisplayName());
        xferPorts.add(dn.getXferPort());
      }
      InetSocketAddress http = cluster.getNameNode().getHttpAddress();
      // The addresses it bound (127.0.0.1), not the "localhost" of cluster.getURI().
      System.out.println("READY {\"uri\": \"hdfs://127.0.0.1:" + cluster.getNameNodePort()
          + "\", \"http\": \"127.0.0.1:" + http.getPort() + "\", \"datanodes\": "
          + datanodesJson(cluster) + "}");
      System.out.flush();

      BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      String line;
      while ((line = in.readLine()) != null) {
        String[] cmd = line.trim().split("\\s+");
        try {
          switch (cmd[0]) {
            case "stop-datanode": {
              int n = Integer.parseInt(cmd[1]);
              if (stopped.containsKey(n)) throw new IllegalStateException("datanode " + n + " is stopped");
              // By name: stopping and restarting reorders cluster.getDataNodes().
              stopped.put(n, cluster.stopDataNode(names.get(n)));
              reply("OK stopped datanode " + n);
              break;
            }
            case "restart-datanode": {
              int n = Integer.parseInt(cmd[1]);
              MiniDFSCluster.DataNodeProperties props = stopped.remove(n);
              if (props == null) throw new IllegalStateException("datanode " + n + " is running");
              cluster.restartDataNode(props, true);
              cluster.waitActive();
              reply("OK restarted datanode " + n);
              break;
            }
            case "datanodes":
              reply("OK " + datanodesJson(cluster));
              break;
            case "hold-writes":
              hold.arm(Pattern.compile(line.trim().substring(cmd[0].length()).trim()));
              reply("OK holding writes");
              break;
            case "await-held":
              reply("OK " + hold.awaitHeld((long) (Double.parseDouble(cmd[1]) * 1000), xferPorts));
              break;
            case "release-writes":
              hold.release();
              reply("OK released");
              break;
            case "shutdown":
              reply("OK shutting down");
              return;
            case "":
              break;
            default:
              reply("ERROR unknown command " + cmd[0]);
          }
        } catch (Exception e) {
          reply("ERROR " + e.toString().replace('\n', ' '));
        }
      }
    } finally {
      cluster.shutdown();
    }
  }

  /**
   * Holds one upload in flight, for outage tests (a datanode killed mid-upload). Armed with a
   * regular expression, it holds the first file being written whose path matches: in each
   * datanode of its pipeline, the thread receiving the block stops after its first packet was
   * forwarded downstream and written, before it is acknowledged. The writer is then mid-upload
   * (the file under construction, its first block open in a pipeline of datanodes, the client
   * waiting for acknowledgements), for as long as the test needs to stop a datanode. A held
   * thread goes on at {@code release-writes}, or ends when its datanode shuts down (which
   * interrupts it). Other files' writes pass.
   *
   * The block being received is in the receiving thread's name (DataXceiver names its thread
   * "... [Receiving block BP-...:blk_ID_GS]"); the namenode (same process) maps it to the file.
   */
  static final class WriteHold extends DataNodeFaultInjector {
    private static final Pattern BLOCK = Pattern.compile("blk_(-?\\d+)_");
    private final MiniDFSCluster cluster;
    private Pattern pattern; // the files to hold; null: hold nothing
    private String heldPath;
    private long heldBlock;

    WriteHold(MiniDFSCluster cluster) {
      this.cluster = cluster;
    }

    synchronized void arm(Pattern p) {
      pattern = p;
      heldPath = null;
    }

    synchronized void release() {
      pattern = null;
      notifyAll();
    }

    /** Waits until a write is held: its path and pipeline (datanode numbers, in order) as JSON. */
    synchronized String awaitHeld(long timeoutMs, List<Integer> xferPorts) throws Exception {
      long deadline = System.currentTimeMillis() + timeoutMs;
      while (heldPath == null) {
        long left = deadline - System.currentTimeMillis();
        if (left <= 0) throw new TimeoutException("no write matching " + pattern + " in " + timeoutMs + " ms");
        wait(left);
      }
      List<String> pipeline = new ArrayList<>();
      BlockInfo info = cluster.getNamesystem().getBlockManager().getStoredBlock(new Block(heldBlock));
      if (info != null && info.getUnderConstructionFeature() != null) {
        for (DatanodeStorageInfo s : info.getUnderConstructionFeature().getExpectedStorageLocations()) {
          pipeline.add(String.valueOf(xferPorts.indexOf(s.getDatanodeDescriptor().getXferPort())));
        }
      }
      return "{\"path\": \"" + heldPath + "\", \"block\": " + heldBlock + ", \"pipeline\": ["
          + String.join(", ", pipeline) + "]}";
    }

    private String pathOf(long blockId) {
      FSNamesystem ns = cluster.getNamesystem();
      BlockInfo info = ns.getBlockManager().getStoredBlock(new Block(blockId));
      if (info == null) return null;
      BlockCollection file = ns.getBlockCollection(info.getBlockCollectionId());
      return file == null ? null : file.getName();
    }

    @Override
    public void delayWriteToDisk() {
      synchronized (this) {
        if (pattern == null) return;
      }
      Matcher m = BLOCK.matcher(Thread.currentThread().getName());
      if (!m.find()) return;
      long block = Long.parseLong(m.group(1));
      String path = pathOf(block);
      synchronized (this) {
        if (pattern == null || path == null || !pattern.matcher(path).find()) return;
        if (heldPath == null) {
          heldPath = path;
          heldBlock = block;
          notifyAll();
        } else if (heldBlock != block) {
          return;
        }
        try {
          while (pattern != null) wait(100);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt(); // its datanode is shutting down
        }
      }
    }
  }

  private static String datanodesJson(MiniDFSCluster cluster) {
    List<String> out = new ArrayList<>();
    for (DataNode dn : cluster.getDataNodes()) out.add("\"" + dn.getDisplayName() + "\"");
    return "[" + String.join(", ", out) + "]";
  }

  private static void reply(String line) {
    System.out.println(line);
    System.out.flush();
  }
}
