// Drives Spark's own FileBasedWriteAheadLog / BatchedWriteAheadLog for benchmarks/wal_bench.py.
// Compiled at run time against pyspark's jars; prints one JSON object per task on stdout.
// Every task first runs the same work unmeasured in the same JVM (JIT warm-up), as a streaming
// app's long-running JVM would be warm, then the measured pass.
//
//   write   DIR SIZE SECONDS THREADS BATCHED WARMUP_SECONDS
//           -> {"records", "seconds", "p50_us", "p99_us"}   (time-boxed; every 16th write timed)
//   readall DIR                                   -> {"seconds", "records", "bytes"} (2nd pass)
//   random  DIR SIZE COUNT READS                  -> {"p50_us", "p99_us"} (after 20,000 reads)
import java.io.File;
import java.nio.ByteBuffer;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;
import org.apache.hadoop.conf.Configuration;
import org.apache.spark.SparkConf;
import org.apache.spark.streaming.util.*;

public class SparkWalBench {
    static final int SAMPLE_EVERY = 16;

    static WriteAheadLog open(String dir, boolean batched) {
        SparkConf conf = new SparkConf(false);
        WriteAheadLog log = new FileBasedWriteAheadLog(conf, dir, new Configuration(), 60, 3, false);
        return batched ? new BatchedWriteAheadLog(log, conf) : log;
    }

    static double pct(List<Long> xs, double p) {
        if (xs.isEmpty()) return 0;
        Collections.sort(xs);
        return xs.get(Math.min(xs.size() - 1, (int) (p * xs.size()))) / 1e3;
    }

    static void deleteTree(File f) {
        File[] kids = f.listFiles();
        if (kids != null) for (File k : kids) deleteTree(k);
        f.delete();
    }

    /** Writers append until the deadline; returns {records, seconds} and fills lat (ns). */
    static double[] timedWrite(String dir, int size, double seconds, int threads, boolean batched,
                               List<Long> lat) throws Exception {
        WriteAheadLog log = open(dir, batched);
        byte[] payload = new byte[size];
        new Random(1).nextBytes(payload);
        AtomicLong total = new AtomicLong();
        CountDownLatch start = new CountDownLatch(1);
        List<Thread> ts = new ArrayList<>();
        List<List<Long>> lats = new ArrayList<>();
        final long[] deadline = new long[1];
        for (int t = 0; t < threads; t++) {
            List<Long> mine = new ArrayList<>();
            lats.add(mine);
            Thread th = new Thread(() -> {
                try {
                    start.await();
                    long n = 0, end = deadline[0];
                    while (true) {
                        long t0 = System.nanoTime();
                        log.write(ByteBuffer.wrap(payload), System.currentTimeMillis());
                        long t1 = System.nanoTime();
                        mine.add(t1 - t0);
                        for (int i = 1; i < SAMPLE_EVERY; i++)
                            log.write(ByteBuffer.wrap(payload), System.currentTimeMillis());
                        n += SAMPLE_EVERY;
                        if (t1 >= end) break;
                    }
                    total.addAndGet(n);
                } catch (Exception e) { throw new RuntimeException(e); }
            });
            th.start();
            ts.add(th);
        }
        long t0 = System.nanoTime();
        deadline[0] = t0 + (long) (seconds * 1e9);
        start.countDown();
        for (Thread th : ts) th.join();
        double secs = (System.nanoTime() - t0) / 1e9;
        log.close();
        for (List<Long> l : lats) lat.addAll(l);
        return new double[] {total.get(), secs};
    }

    public static void main(String[] a) throws Exception {
        String task = a[0], dir = a[1];
        if (task.equals("write")) {
            int size = Integer.parseInt(a[2]);
            double seconds = Double.parseDouble(a[3]);
            int threads = Integer.parseInt(a[4]);
            boolean batched = Boolean.parseBoolean(a[5]);
            double warmup = Double.parseDouble(a[6]);
            if (warmup > 0) {
                File w = new File(dir, "warmup");
                timedWrite(w.getPath(), size, warmup, threads, batched, new ArrayList<>());
                deleteTree(w);  // the measured pass starts on a disk in the same state
            }
            List<Long> lat = new ArrayList<>();
            double[] r = timedWrite(new File(dir, "run").getPath(), size, seconds, threads, batched, lat);
            System.out.printf(Locale.ROOT,
                "{\"records\": %d, \"seconds\": %.6f, \"p50_us\": %.3f, \"p99_us\": %.3f}%n",
                (long) r[0], r[1], pct(lat, 0.5), pct(lat, 0.99));
        } else if (task.equals("readall")) {
            double secs = 0;
            long n = 0, bytes = 0;
            for (int pass = 0; pass < 2; pass++) {  // the first pass warms the JIT up
                WriteAheadLog log = open(dir, false);
                long t0 = System.nanoTime();
                n = 0; bytes = 0;
                Iterator<ByteBuffer> it = log.readAll();
                while (it.hasNext()) { ByteBuffer b = it.next(); n++; bytes += b.remaining(); }
                secs = (System.nanoTime() - t0) / 1e9;
                log.close();
            }
            System.out.printf(Locale.ROOT, "{\"seconds\": %.6f, \"records\": %d, \"bytes\": %d}%n", secs, n, bytes);
        } else if (task.equals("random")) {
            int size = Integer.parseInt(a[2]), count = Integer.parseInt(a[3]), reads = Integer.parseInt(a[4]);
            WriteAheadLog log = open(dir, false);
            byte[] payload = new byte[size];
            List<WriteAheadLogRecordHandle> hs = new ArrayList<>();
            for (int i = 0; i < count; i++) hs.add(log.write(ByteBuffer.wrap(payload), System.currentTimeMillis()));
            Random r = new Random(2);
            for (int i = 0; i < 20000; i++) log.read(hs.get(r.nextInt(count)));  // JIT warm-up
            List<Long> lat = new ArrayList<>();
            for (int i = 0; i < reads; i++) {
                WriteAheadLogRecordHandle h = hs.get(r.nextInt(count));
                long t0 = System.nanoTime();
                log.read(h);
                lat.add(System.nanoTime() - t0);
            }
            log.close();
            System.out.printf(Locale.ROOT, "{\"p50_us\": %.3f, \"p99_us\": %.3f}%n", pct(lat, 0.5), pct(lat, 0.99));
        }
        System.exit(0);
    }
}
