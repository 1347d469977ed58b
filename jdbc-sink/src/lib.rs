//! Exactly-once relational sink: PostgreSQL and MariaDB/MySQL, through prepared (XA) transactions or idempotent
//! upserts.
//!
//! [`JdbcSink`] writes Arrow batches into a table, one database transaction per checkpoint and subtask, in one of
//! four [`WriteMode`]s: `xa` (prepared transactions, exactly once), `xa_upsert` (prepared transactions holding
//! upserts and deletes by key), `upsert` (`ON CONFLICT` / `ON DUPLICATE KEY`, effectively exactly once without
//! XA) and `append` with a dedup table. Build it from a job file with
//! [`JdbcSinkFactory`] (`type = "jdbc"`).
//!
//! # The xa mode
//! | step | PostgreSQL | MariaDB / MySQL |
//! |---|---|---|
//! | `begin(N)` | `BEGIN` | `XA START '<xid>'` |
//! | `write` | binary `COPY .. FROM STDIN` into the table | multi-row prepared `INSERT` (up to 2000 rows each) |
//! | `pre_commit(N)` | owner check, marker row, `PREPARE TRANSACTION '<xid>'` | owner check, marker row, `XA END`, `XA PREPARE` |
//! | `commit` (any process) | `COMMIT PREPARED '<xid>'` | `XA COMMIT '<xid>'` |
//! | `recover` | `pg_prepared_xacts`: commit the restored ones, roll back the rest | `XA RECOVER`: the same |
//!
//! `<xid>` is `ratchet.<scope>.<subtask>.<checkpoint>` ([`Xid`]; the scope is the sink id unless configured). The **marker row** `(sink, subtask,
//! checkpoint)` in `ratchet_xa_commits` is written inside the transaction, so it is visible exactly when the
//! transaction committed: committing an xid that is no longer prepared succeeds when its marker is visible
//! (committed before) and fails naming the lost checkpoint when it is not (rolled back outside Ratchet), never by
//! guessing.
//!
//! | crash point | state in the database | recovery |
//! |---|---|---|
//! | before `pre_commit` | an open transaction; the server rolls it back with the connection | nothing; replay |
//! | after `pre_commit`, before the checkpoint record is durable | prepared, in no record | rolled back |
//! | after the record is durable, before commit | prepared, in the record | committed |
//! | after commit | gone, marker visible | nothing: already committed |
//!
//! # Fencing: the owner row
//! `ratchet_sink_owners` holds one row per sink subtask with an owner epoch. `recover` raises it (after resolving
//! prepared transactions), and every checkpoint transaction updates the row *where the epoch is still its own*
//! just before it prepares or commits. So an older instance (a zombie resumed after its replacement recovered, or
//! the loser of two starts) matches nothing and fails [`Fenced`](connector_api::ErrorKind::Fenced) with its
//! transaction rolled back: it can neither prepare nor apply anything after a newer recovery. The update's row
//! lock lasts until the transaction ends (a prepared transaction keeps it), so the epoch raise of a recovery waits
//! for a transaction that passed its check just before; recovery then lists and resolves again (up to 15 times,
//! `lock_timeout` each). One consequence: checkpoint N+1's pre-commit waits for checkpoint N's commit to release
//! the row, which the driver starts right after N's record is durable (milliseconds).
//!
//! # Upsert and append modes
//! One ordinary transaction per checkpoint, committed at pre-commit together with the owner row's `checkpoint`
//! (the progress row, which [`JdbcCommitter::is_committed`](connector_api::Committer::is_committed) reads).
//! PostgreSQL: each batch is one statement whose rows arrive as binary array parameters (one per column,
//! `unnest(..) WITH ORDINALITY`, so the last row of a key wins): `MERGE` on PostgreSQL 15+ (no speculative
//! insertion: ~40% cheaper than `ON CONFLICT` for new keys), and `INSERT .. SELECT .. ON CONFLICT (key) DO
//! UPDATE` where `MERGE` meets a key a concurrent writer inserted first (or on older servers). MariaDB: multi-row
//! `INSERT .. ON DUPLICATE KEY UPDATE` (statement order makes the last row win). Rows of a checkpoint
//! whose record never became durable may be visible before the replay writes them again with the same effect:
//! *effectively* exactly once. In the append mode, a dedup table of message ids written in the same transaction
//! drops replayed rows; ids older than `retention` are deleted (a replay reaching further back would duplicate).
//! On MariaDB each statement's ids are claimed first with `INSERT IGNORE .. RETURNING` (10.5+), and only the
//! rows whose ids were new are inserted.
//!
//! A batch the table refuses (a constraint, a value out of range) is refused whole, behind a savepoint, with an
//! error of kind [`BadRecord`](connector_api::ErrorKind::BadRecord) naming the table and the row's first column;
//! the transaction goes on without it, so the driver can dead-letter it. A table that does not fit the batches
//! (missing column, incompatible type) is refused at start naming the column, unless the sink's `evolution` is
//! `add-columns`: then the columns the table lacks are added at start, and the columns the batches gain while
//! running are added at a checkpoint boundary ([`TwoPhaseCommit::evolve`](connector_api::TwoPhaseCommit::evolve):
//! `ALTER TABLE .. ADD COLUMN IF NOT EXISTS` from a new writer connection, bounded by `lock_timeout`).
//!
//! # Tombstones
//! A Kafka record whose value is null deletes its key. The keyed modes (`upsert`, `xa_upsert`) apply such tombstones
//! ([`TwoPhaseCommit::write_tombstones`](connector_api::TwoPhaseCommit::write_tombstones)) as deletes by key in
//! the checkpoint's transaction, in order with the rows (a key upserted then deleted in one checkpoint ends
//! deleted; one deleted then upserted again ends present), committed with them (at pre-commit; `xa_upsert`: at
//! commit, after the prepare); a replay deletes
//! again with the same effect. PostgreSQL: one
//! `DELETE FROM <table> t USING unnest($1::<type>[], ..) AS s(<key columns>) WHERE t.<k> = s.<k> AND ..` per call,
//! the keys as binary arrays like the rows; MariaDB: `DELETE FROM <table> WHERE (<k1> = ? AND ..) OR ..`, up to
//! 1000 keys per statement. Both behind the write savepoint.
//!
//! Each record key (its raw bytes) is decoded into the mode's key columns, with their types from the batches'
//! schema:
//! - **one key column**: the key's bytes are that column's value. A Binary / LargeBinary column takes them as
//!   they are; any other column needs UTF-8 text, which a text column takes as it is, and an integer,
//!   floating-point, boolean (`true` / `false`), date or timestamp column parses (surrounding whitespace
//!   ignored): the key `42` deletes the row with `id = 42`. A key that is a JSON object holding the column
//!   (`{"id": 42}`) is accepted too.
//! - **several key columns**: the key is a JSON object holding each of them (Kafka Connect's JSON keys, without a
//!   schema envelope): `{"tenant": "a", "id": 42}`; other fields are ignored.
//!
//! In a JSON key an integer column takes an integer (or a string of one; a fraction is refused), a floating-point
//! column a number, a text column a string, a boolean column `true` / `false`, a binary column a hex string, a
//! date or timestamp column a string (`2024-05-01`, RFC 3339; a timestamp without an offset is UTC) or a number in
//! the column's unit. A key that does not fit is a [`BadRecord`](connector_api::ErrorKind::BadRecord) error
//! (phase `Write`) naming the key, the column and what the column takes, and nothing of that call is deleted
//! (every key is decoded first; the driver stays usable, as for a refused batch). A tombstone without a key
//! deletes nothing.
//!
//! The xa mode (its tables have no key) and the append mode (it only appends) cannot express a deletion:
//! `write_tombstones` returns `false` there and the worker skips the tombstones, counted.
//!
//! # Change streams
//! A change stream's batches (a CDC source's rows, such as `kafka_source`'s Debezium decoding: the row columns plus
//! change columns marked by the source, [`connector_api::ChangeColumns`], among them `__op`) are *applied* by the
//! keyed modes and *appended* by the others:
//!
//! | mode | a change batch |
//! |---|---|
//! | `xa_upsert` | applied inside the checkpoint's prepared transaction: visible at commit, exactly once |
//! | `upsert` | applied in the checkpoint's ordinary transaction, committed at pre-commit: effectively exactly once |
//! | `xa`, `append` | appended whole, change columns included: a changelog table |
//!
//! Applying: the changes go in source order ([`connector_api::ChangeColumns::in_order`]): each run of
//! consecutive upserts (`c`, `u`, `r`) is one statement (per key the last change of the run), each run of deletes
//! (`d`) the same statements as tombstones, a truncate (`t`) deletes every row, in the order they came, so other
//! unique indexes of the table hold through a primary-key change (Debezium's `d` of the old key, then `c` of the
//! new one) or a swap of unique values. The change columns are not written (they are not the table's:
//! `create_table` leaves them out, and an existing table need not have them). A change that did not carry some
//! columns (Debezium's unavailable-value placeholder, named in `__unavailable`) updates its key's row without them
//! (`UPDATE .. WHERE <key>`), keeping the table's values; a key with no row there is a
//! [`BadRecord`](connector_api::ErrorKind::BadRecord) naming `REPLICA IDENTITY FULL`. A change whose key is null
//! is a bad record. Batches are applied in order, so across batches the later change wins too. A replay after a
//! crash applies the same changes in the same order with the same result. An operation other than `c`, `u`, `r`,
//! `d`, `t` is a bad record and nothing of its batch is applied; a statement the table refuses refuses the batch
//! (behind the write savepoint).
//!
//! # Types
//! Every Arrow type is written exactly or refused at start and by `check-config`, naming the field
//! (docs/types.md): the Arrow side and `create_table`'s DDL per dialect are the table in `columns.rs`, which existing
//! column types take which values is `pg::cell` and `mysql::target`. Values go in PostgreSQL's binary format for
//! the column's type and as typed MariaDB parameters, never through text parsing; a value a column would round,
//! cut or pad (more fractional digits than `time(3)`, a decimal past numeric(P, S), a string longer than
//! VARCHAR(n), a character a MariaDB column's charset lacks) is a bad record naming the row. MariaDB sessions run
//! in `utf8mb4`, UTC and strict mode; key columns must compare byte for byte (a case-, accent- or
//! space-insensitive collation is refused at start).
//!
//! # Row locks of prepared transactions
//! A prepared transaction keeps the locks of the rows it wrote until it is committed: another writer inserting or
//! upserting one of its keys (or updating a row it updated) waits until the commit. In production that is one
//! checkpoint interval plus the commit (the rows were written during the interval); after a crash, until a
//! recovery resolves the transaction. Measured in `tests/faults.rs` on both servers: a transaction held prepared
//! for 800 ms made another session's upsert of one of its keys wait 800 ms, then it went through. `lock_timeout`
//! bounds how long the *sink* waits for anyone's locks; other writers need their own timeout. `pg_prepared_xacts`
//! / `XA RECOVER` list the prepared transactions (`ratchet inspect` will, with the worker).
//!
//! # MariaDB specifics
//! MariaDB keeps a prepared XA transaction attached to the session that prepared it until the server has ended that
//! session: until then every other session's `XA COMMIT` / `XA ROLLBACK` fails "unknown XID" (as for a transaction
//! that is gone), while `XA RECOVER` lists it; and the server may end a closed session long after its client went
//! away. So the writer closes its session after `XA PREPARE`, opens the next one, and ends the old one itself with
//! `KILL CONNECTION` when it is still on the server (only its own: the same user, within one server run), which
//! leaves the transaction prepared; then it waits (up to 2 s) until the old session is gone from the process list.
//! A commit that still meets "unknown XID" asks `XA RECOVER`: not listed, the transaction committed before (its
//! marker is visible) or is lost; listed, it is still attached (a paused process's session, or one whose client
//! died before the server noticed) and is asked about again for up to 8 s, then the commit fails retryable naming
//! the xid: the checkpoint stays decided and prepared, the driver retries, and recovery commits it. Rolling back a
//! transaction still attached likewise fails retryable naming it, so recovery stops with that reason instead of
//! waiting for the owner row it holds. `KILL CONNECTION <id>` of such a session (when its process is gone) leaves
//! the transaction prepared. Sessions run READ COMMITTED, and stale markers are deleted by key, so no statement
//! waits on a gap or on the next index record held by another subtask's prepared transaction.
//!
//! # Types
//! Arrow columns map to SQL types as below (the table is created with these by `create_table`; an existing
//! table's column must accept the value, checked at start on PostgreSQL). Other Arrow types are refused at start
//! naming the column (UInt64, decimals, lists, structs and the rest: cast them before the sink).
//!
//! | Arrow | PostgreSQL | MariaDB / MySQL |
//! |---|---|---|
//! | Boolean | `boolean` | `BOOLEAN` |
//! | Int8, Int16, UInt8 | `smallint` | `SMALLINT` |
//! | Int32, UInt16 | `integer` | `INT` |
//! | Int64, UInt32 | `bigint` | `BIGINT` |
//! | Float32 | `real` | `FLOAT` |
//! | Float64 | `double precision` | `DOUBLE` |
//! | Utf8, LargeUtf8, Utf8View | `text` | `LONGTEXT` (`VARCHAR(255)` for key and message-id columns) |
//! | Binary, LargeBinary | `bytea` | `LONGBLOB` (`VARBINARY(255)` for keys) |
//! | Date32 | `date` | `DATE` |
//! | Timestamp(unit, None) | `timestamp` | `DATETIME(6)` |
//! | Timestamp(unit, Some(tz)) | `timestamptz` (the instant) | `DATETIME(6)` (the instant, in UTC) |
#![deny(missing_docs)]

mod check;
mod columns;
mod commit;
mod committable;
mod config;
mod database;
mod error;
mod factory;
mod keeping;
mod keys;
mod mysql;
mod pg;
mod recovery;
mod savepoint;
mod sink;
mod xid;

pub use commit::JdbcCommitter;
pub use committable::JdbcCommittable;
pub use config::{ConnectionConfig, DedupConfig, Dialect, JdbcSinkConfig, WriteMode};
pub use database::CommitOutcome;
pub use factory::{DEFAULT_LOCK_TIMEOUT, JdbcSinkFactory, JdbcSinkSettings};
pub use sink::JdbcSink;
pub use xid::Xid;
