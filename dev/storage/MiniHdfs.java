import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.server.datanode.DataNode;

/**
 * Hadoop's MiniDFSCluster as its own process, for the storage tests
 * (tests/servers/hdfs_cluster.py starts it with `java -cp build/storage/hdfs-minicluster/*
 * dev/storage/MiniHdfs.java BASE_DIR DATANODES`, Java's single-file source launcher).
 *
 * Everything binds 127.0.0.1 on free ports. Once up it prints one line
 * {@code READY {"uri": ..., "http": ..., "datanodes": [...]}} on stdout, then serves commands, one
 * per stdin line, each answered by one line ({@code OK ...} or {@code ERROR ...}):
 * {@code stop-datanode N}, {@code restart-datanode N} (same ports and storage), {@code datanodes},
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
    Runtime.getRuntime().addShutdownHook(new Thread(cluster::shutdown));
    try {
      cluster.waitActive();
      for (DataNode dn : cluster.getDataNodes()) names.add(dn.getDisplayName());
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
