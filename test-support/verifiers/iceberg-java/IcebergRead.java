import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.LocalTime;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.BaseTable;
import org.apache.iceberg.StaticTableOperations;
import org.apache.iceberg.Table;
import org.apache.iceberg.aws.s3.S3FileIO;
import org.apache.iceberg.data.IcebergGenerics;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.hadoop.HadoopFileIO;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.types.Types;

/**
 * The reference reader of Ratchet's tests: Apache Iceberg's own Java library reads the current snapshot of the
 * table whose metadata file is given, applying its delete files (merge-on-read, equality and position deletes),
 * and prints every row as JSON: {"column_names": [...], "rows": [[...], ...]}: integers as numbers; decimals as
 * their plain text; times, dates and timestamps in ISO form with six fractional digits (timestamptz in UTC with
 * a Z); bytes and fixed as "base64:..."; structs as objects, lists as arrays, maps as objects; anything else
 * (strings, floats, booleans, UUIDs) as its string form; null as null.
 *
 * usage: java -cp 'LIBS/*:CLASSES' IcebergRead METADATA_LOCATION
 *        java -cp 'LIBS/*:CLASSES' IcebergRead --serve
 *
 * With --serve it reads one metadata location per line of its input and answers each with one line of JSON (the
 * same, or {"error": "..."} naming what failed), until its input ends: a test run pays the JVM's start-up once per
 * verifier interpreter instead of once per read. An s3:// location is read with RATCHET_S3_ENDPOINT / _REGION /
 * _ACCESS_KEY / _SECRET_KEY (path-style access).
 */
public final class IcebergRead {
  public static void main(String[] args) throws Exception {
    if (args.length == 1 && args[0].equals("--serve")) {
      BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      for (String line = in.readLine(); line != null; line = in.readLine()) {
        String answer;
        try {
          answer = read(line.trim());
        } catch (Exception | LinkageError e) {
          StringWriter trace = new StringWriter();
          e.printStackTrace(new PrintWriter(trace));
          answer = "{\"error\": " + quote(trace.toString()) + "}";
        }
        System.out.println(answer);
        System.out.flush();
      }
      return;
    }
    if (args.length != 1) {
      System.err.println("usage: IcebergRead METADATA_LOCATION | --serve");
      System.exit(2);
    }
    System.out.println(read(args[0]));
  }

  /** Every row of the current snapshot of the table whose metadata file is at {@code location}, as JSON. */
  private static String read(String location) throws Exception {
    try (FileIO io = fileIo(location)) {
      Table table = new BaseTable(new StaticTableOperations(location, io), "verified");
      List<Types.NestedField> columns = table.schema().columns();
      StringBuilder out = new StringBuilder("{\"column_names\": [");
      for (int i = 0; i < columns.size(); i++) {
        out.append(i == 0 ? "" : ", ").append(quote(columns.get(i).name()));
      }
      out.append("], \"rows\": [");
      boolean first = true;
      try (CloseableIterable<Record> rows = IcebergGenerics.read(table).build()) {
        for (Record row : rows) {
          out.append(first ? "" : ", ").append('[');
          first = false;
          for (int i = 0; i < columns.size(); i++) {
            out.append(i == 0 ? "" : ", ").append(value(row.getField(columns.get(i).name())));
          }
          out.append(']');
        }
      }
      return out.append("]}").toString();
    }
  }

  private static FileIO fileIo(String location) {
    if (location.startsWith("s3://")) {
      Map<String, String> props = new HashMap<>();
      props.put("s3.endpoint", System.getenv("RATCHET_S3_ENDPOINT"));
      props.put("s3.access-key-id", System.getenv("RATCHET_S3_ACCESS_KEY"));
      props.put("s3.secret-access-key", System.getenv("RATCHET_S3_SECRET_KEY"));
      props.put("s3.path-style-access", "true");
      String region = System.getenv("RATCHET_S3_REGION");
      props.put("client.region", region == null ? "us-east-1" : region);
      S3FileIO s3 = new S3FileIO();
      s3.initialize(props);
      return s3;
    }
    return new HadoopFileIO(new Configuration());
  }

  private static final DateTimeFormatter TIME = DateTimeFormatter.ofPattern("HH:mm:ss.SSSSSS");
  private static final DateTimeFormatter DATE_TIME = DateTimeFormatter.ofPattern("uuuu-MM-dd'T'HH:mm:ss.SSSSSS");

  private static String value(Object value) {
    if (value == null) {
      return "null";
    }
    if (value instanceof Long || value instanceof Integer) {
      return value.toString();
    }
    if (value instanceof BigDecimal decimal) {
      return quote(decimal.toPlainString());
    }
    if (value instanceof ByteBuffer buffer) {
      ByteBuffer copy = buffer.duplicate();
      byte[] bytes = new byte[copy.remaining()];
      copy.get(bytes);
      return quote("base64:" + Base64.getEncoder().encodeToString(bytes));
    }
    if (value instanceof byte[] bytes) {
      return quote("base64:" + Base64.getEncoder().encodeToString(bytes));
    }
    if (value instanceof LocalTime time) {
      return quote(TIME.format(time));
    }
    if (value instanceof LocalDateTime dateTime) {
      return quote(DATE_TIME.format(dateTime));
    }
    if (value instanceof OffsetDateTime instant) {
      return quote(DATE_TIME.format(instant.withOffsetSameInstant(ZoneOffset.UTC)) + "Z");
    }
    if (value instanceof LocalDate date) {
      return quote(date.toString());
    }
    if (value instanceof Record record) {
      StringBuilder out = new StringBuilder("{");
      List<Types.NestedField> fields = record.struct().fields();
      for (int i = 0; i < fields.size(); i++) {
        out.append(i == 0 ? "" : ", ").append(quote(fields.get(i).name())).append(": ").append(value(record.get(i)));
      }
      return out.append('}').toString();
    }
    if (value instanceof List<?> list) {
      StringBuilder out = new StringBuilder("[");
      for (int i = 0; i < list.size(); i++) {
        out.append(i == 0 ? "" : ", ").append(value(list.get(i)));
      }
      return out.append(']').toString();
    }
    if (value instanceof Map<?, ?> map) {
      StringBuilder out = new StringBuilder("{");
      boolean first = true;
      for (Map.Entry<?, ?> entry : map.entrySet()) {
        out.append(first ? "" : ", ").append(quote(String.valueOf(entry.getKey()))).append(": ").append(value(entry.getValue()));
        first = false;
      }
      return out.append('}').toString();
    }
    return quote(value.toString());
  }

  private static String quote(String s) {
    StringBuilder out = new StringBuilder("\"");
    for (char c : s.toCharArray()) {
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    return out.append('"').toString();
  }
}
