// Drives Spark's own FileBasedWriteAheadLog / BatchedWriteAheadLog for benchmarks/wal_bench.py.
// Compiled at run time against pyspark's jars; prints one JSON object per task on stdout.
//
//   write  DIR SIZE COUNT THREADS BATCHED   -> {"seconds", "p50_us", "p99_us", "files"}
//   readall DIR                             -> {"seconds", "records", "bytes"}
//   random DIR SIZE COUNT READS             -> {"p50_us", "p99_us"}   (writes COUNT, reads READS)
import java.nio.ByteBuffer;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;
import org.apache.hadoop.conf.Configuration;
import org.apache.spark.SparkConf;
import org.apache.spark.streaming.util.*;

public class SparkWalBench {
    static WriteAheadLog open(String dir, boolean batched) {
        SparkConf conf = new SparkConf(false);
        WriteAheadLog log = new FileBasedWriteAheadLog(conf, dir, new Configuration(), 60, 3, false);
        return batched ? new BatchedWriteAheadLog(log, conf) : log;
    }

    static long pct(long[] xs, double p) {
        long[] s = xs.clone();
        Arrays.sort(s);
        return s[Math.min(s.length - 1, (int) (p * s.length))];
    }

    public static void main(String[] a) throws Exception {
        String task = a[0], dir = a[1];
        if (task.equals("write")) {
            int size = Integer.parseInt(a[2]), count = Integer.parseInt(a[3]);
            int threads = Integer.parseInt(a[4]);
            boolean batched = Boolean.parseBoolean(a[5]);
            WriteAheadLog log = open(dir, batched);
            byte[] payload = new byte[size];
            new Random(1).nextBytes(payload);
            long[] lat = new long[count];
            AtomicInteger next = new AtomicInteger();
            CountDownLatch start = new CountDownLatch(1);
            List<Thread> ts = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                Thread th = new Thread(() -> {
                    try {
                        start.await();
                        int i;
                        while ((i = next.getAndIncrement()) < count) {
                            long t0 = System.nanoTime();
                            log.write(ByteBuffer.wrap(payload), System.currentTimeMillis());
                            lat[i] = System.nanoTime() - t0;
                        }
                    } catch (Exception e) { throw new RuntimeException(e); }
                });
                th.start();
                ts.add(th);
            }
            long t0 = System.nanoTime();
            start.countDown();
            for (Thread th : ts) th.join();
            double secs = (System.nanoTime() - t0) / 1e9;
            log.close();
            int files = new java.io.File(dir).list((d, n) -> n.startsWith("log-")).length;
            System.out.printf(Locale.ROOT, "{\"seconds\": %.6f, \"p50_us\": %.3f, \"p99_us\": %.3f, \"files\": %d}%n",
                secs, pct(lat, 0.5) / 1e3, pct(lat, 0.99) / 1e3, files);
        } else if (task.equals("readall")) {
            WriteAheadLog log = open(dir, false);
            long t0 = System.nanoTime(), n = 0, bytes = 0;
            Iterator<ByteBuffer> it = log.readAll();
            while (it.hasNext()) { ByteBuffer b = it.next(); n++; bytes += b.remaining(); }
            double secs = (System.nanoTime() - t0) / 1e9;
            log.close();
            System.out.printf(Locale.ROOT, "{\"seconds\": %.6f, \"records\": %d, \"bytes\": %d}%n", secs, n, bytes);
        } else if (task.equals("random")) {
            int size = Integer.parseInt(a[2]), count = Integer.parseInt(a[3]), reads = Integer.parseInt(a[4]);
            WriteAheadLog log = open(dir, false);
            byte[] payload = new byte[size];
            List<WriteAheadLogRecordHandle> hs = new ArrayList<>();
            for (int i = 0; i < count; i++) hs.add(log.write(ByteBuffer.wrap(payload), System.currentTimeMillis()));
            Random r = new Random(2);
            for (int i = 0; i < 200; i++) log.read(hs.get(r.nextInt(count)));  // JIT warm-up
            long[] lat = new long[reads];
            for (int i = 0; i < reads; i++) {
                WriteAheadLogRecordHandle h = hs.get(r.nextInt(count));
                long t0 = System.nanoTime();
                log.read(h);
                lat[i] = System.nanoTime() - t0;
            }
            log.close();
            System.out.printf(Locale.ROOT, "{\"p50_us\": %.3f, \"p99_us\": %.3f}%n", pct(lat, 0.5) / 1e3, pct(lat, 0.99) / 1e3);
        }
        System.exit(0);
    }
}
