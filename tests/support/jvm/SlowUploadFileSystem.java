import java.io.IOException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;

import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * {@code slowupload://}: Hadoop's local file system, except that once the test arms it, the next
 * upload of a snapshot's SST file (a create under {@code shared/}) hangs in that executor right
 * after the file was created (empty), until the executor is killed.
 *
 * <p>The test arms it by creating {@code <dir>/armed}, where {@code <dir>} is the Hadoop setting
 * {@code keyedstate.test.slowUpload.dir}. The first upload to take the arm (an atomic rename of
 * {@code armed} to {@code claimed-<pid>}) writes {@code fired-<pid>} with the file's path, then
 * sleeps {@code keyedstate.test.slowUpload.hangMs} (default 5 minutes). Everything else behaves as
 * the local file system. Compiled by tests/provider/test_executors.py (javac, against pyspark's Hadoop
 * client) and put on the driver's and executors' class path.
 */
public class SlowUploadFileSystem extends RawLocalFileSystem {
  @Override
  public URI getUri() {
    return URI.create("slowupload:///");
  }

  @Override
  public FSDataOutputStream create(Path f, FsPermission permission, boolean overwrite, int bufferSize,
      short replication, long blockSize, Progressable progress) throws IOException {
    FSDataOutputStream out = super.create(f, permission, overwrite, bufferSize, replication, blockSize, progress);
    hangIfArmed(f);
    return out;
  }

  @Override
  public FSDataOutputStream create(Path f, boolean overwrite, int bufferSize, short replication, long blockSize,
      Progressable progress) throws IOException {
    FSDataOutputStream out = super.create(f, overwrite, bufferSize, replication, blockSize, progress);
    hangIfArmed(f);
    return out;
  }

  private void hangIfArmed(Path f) throws IOException {
    String dir = getConf().get("keyedstate.test.slowUpload.dir");
    if (dir == null || f.getParent() == null || !f.getParent().getName().equals("shared")) {
      return;
    }
    long pid = ProcessHandle.current().pid();
    java.nio.file.Path markers = java.nio.file.Paths.get(dir);
    try {
      Files.move(markers.resolve("armed"), markers.resolve("claimed-" + pid));
    } catch (NoSuchFileException notArmed) {
      return;
    }
    Files.write(markers.resolve("fired-" + pid), f.toString().getBytes(StandardCharsets.UTF_8));
    try {
      Thread.sleep(getConf().getLong("keyedstate.test.slowUpload.hangMs", 300000L));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted while hanging in the upload of " + f, e);
    }
  }
}
