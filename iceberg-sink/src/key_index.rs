//! The key index of the upsert mode's position deletes (`upsert_deletes = "position"`): for every key of the
//! table, where its current row lives (data file, row position). A checkpoint's upsert of a key deletes the
//! row the index names by position and points the key at its new row; a delete of a key deletes that row and
//! forgets the key.
//!
//! # What the index shows
//! The table at one snapshot ([`KeyIndex::shown`], refreshed by [`crate::key_scan`]) with this subtask's decided
//! checkpoints on top (they may not be committed yet: [`pending`](KeyIndex::settle)) and the pre-committed one
//! staged (undone when its checkpoint aborts). A key whose row another writer deleted may still point at that row:
//! deleting a row that is already deleted changes nothing, so such an entry is harmless. A key with a live row the
//! index does not know would keep two rows after an upsert, so every live row is indexed: rebuilt from the table
//! at recovery and whenever a snapshot removed data files, caught up with every other writer's new data files
//! before each pre-commit.
//!
//! # Keys
//! The key columns are encoded in the table's types (`arrow_row`: exact, so a widened `int` key and its `long`
//! column compare equal once both are in the table's type), never hashed alone: a hash collision would delete
//! another key's row.
//!
//! # Memory
//! A key costs its encoded bytes (a `bigint` key: 9 bytes; a text key: its length + 2 per 32 bytes), a 16-byte
//! location and the hash map's slot and control byte; `docs/benchmarks.md` has the measured bytes per million keys.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_row::{RowConverter, Rows, SortField};
use connector_api::{CheckpointId, Error, Phase, Result};
use iceberg::table::Table;

use crate::compaction_moves::Moves;
use crate::error::iceberg_error;
pub(crate) use crate::indexed_file::{IndexedFile, Row};

/// Where one key's current row lives: an index into [`KeyIndex`]'s files and the row's position there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    file: u32,
    pos: u64,
}

/// One key's change by a checkpoint: the encoded key, its row before and after (paths, not indices: a rebuild
/// renumbers the files).
#[derive(Debug)]
struct Change {
    key: Box<[u8]>,
    before: Option<Row>,
    after: Option<Row>,
}

/// The table state the entries were built or caught up from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shown {
    /// Nothing yet (before recovery), or a change made it unusable (a key column's type changed): rebuild.
    Stale,
    /// The table at this snapshot (`None`: a table with no snapshot yet).
    At(Option<i64>),
}

/// Key → (data file, position) of every live row of the table, for one subtask (module docs).
pub(crate) struct KeyIndex {
    /// The key columns, in the table's Arrow types with their field ids.
    key_schema: arrow_schema::SchemaRef,
    converter: RowConverter,
    files: Vec<Arc<IndexedFile>>,
    by_path: HashMap<String, u32>,
    rows: HashMap<Box<[u8]>, Location>,
    shown: Shown,
    /// The changes of decided checkpoints the table may not show yet, oldest first (re-applied over a rebuild).
    pending: Vec<(CheckpointId, Vec<Change>)>,
    /// The changes of the pre-committed checkpoint, undone if it aborts.
    staged: Option<(CheckpointId, Vec<Change>)>,
    /// The compactions of decided checkpoints the table does not show yet, oldest first: their moves apply once
    /// it does ([`apply_compaction`](Self::apply_compaction)), and are forgotten once it shows the checkpoint
    /// committed without them.
    compactions: Vec<(CheckpointId, Moves)>,
    /// The compaction of the pre-committed checkpoint, forgotten if it aborts.
    staged_compaction: Option<(CheckpointId, Moves)>,
}

impl std::fmt::Debug for KeyIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyIndex")
            .field("keys", &self.rows.len())
            .field("files", &self.files.len())
            .field("shown", &self.shown)
            .finish_non_exhaustive()
    }
}

impl KeyIndex {
    /// An empty, stale index of `table` by the columns `key` (their types as the table's current schema has them).
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) naming a key column the table lacks or one `arrow_row` cannot encode.
    pub(crate) fn new(table: &Table, key: &[String]) -> Result<Self> {
        let key_schema = key_schema(table, key)?;
        let converter = RowConverter::new(
            key_schema
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )
        .map_err(|e| {
            Error::config(format!(
                "upsert_key: the key columns of table {} cannot be indexed: {e}",
                table.identifier()
            ))
        })?;
        Ok(Self {
            key_schema,
            converter,
            files: Vec::new(),
            by_path: HashMap::new(),
            rows: HashMap::new(),
            shown: Shown::Stale,
            pending: Vec::new(),
            staged: None,
            compactions: Vec::new(),
            staged_compaction: None,
        })
    }

    /// The table state the index shows.
    pub(crate) fn shown(&self) -> Shown {
        self.shown
    }

    /// The key columns in the table's types.
    pub(crate) fn key_schema(&self) -> &arrow_schema::SchemaRef {
        &self.key_schema
    }

    /// How many keys have a location.
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    /// The heap the index holds, in bytes: the hash table's buckets (its capacity at the load factor of 7/8, a
    /// power of two, each slot a key handle and a location plus one control byte), every key's allocation and the
    /// decided and staged changes, each allocation rounded up as glibc's malloc does (the request plus an 8-byte
    /// header in 16-byte granules, 32 bytes at least).
    pub(crate) fn heap_bytes(&self) -> usize {
        let chunk = |size: usize| ((size + 8 + 15) & !15).max(32);
        let buckets = match self.rows.capacity() {
            0 => 0,
            capacity => (capacity * 8 / 7).next_power_of_two(),
        };
        let slot = std::mem::size_of::<(Box<[u8]>, Location)>();
        let table = chunk(buckets * (slot + 1) + 16);
        let keys: usize = self.rows.keys().map(|k| chunk(k.len())).sum();
        let files: usize = self
            .files
            .iter()
            .map(|f| chunk(std::mem::size_of::<IndexedFile>() + 16) + chunk(f.path.len()))
            .sum();
        let change = std::mem::size_of::<Change>();
        let changes: usize = self
            .pending
            .iter()
            .chain(self.staged.iter())
            .map(|(_, c)| {
                chunk(c.capacity() * change) + c.iter().map(|c| chunk(c.key.len())).sum::<usize>()
            })
            .sum();
        let moves: usize = self
            .compactions
            .iter()
            .chain(self.staged_compaction.iter())
            .map(|(_, m)| m.heap_bytes(chunk))
            .sum();
        table + keys + files + changes + moves
    }

    /// The keys of `batch`'s rows (any batch holding the key columns by name, in any type that converts exactly
    /// into the table's), in row order.
    ///
    /// # Errors
    /// [`BadRecord`](connector_api::ErrorKind::BadRecord) naming the column when a key column is missing or does not convert.
    #[cfg(test)]
    fn keys(&self, table: &str, batch: &RecordBatch) -> Result<Rows> {
        let keys = crate::writer::key_columns(table, &self.key_schema, batch)?;
        self.encode(&keys)
    }

    /// Encodes key columns already in the table's types (`key_schema`'s order).
    pub(crate) fn encode(&self, keys: &RecordBatch) -> Result<Rows> {
        self.converter.convert_columns(keys.columns()).map_err(|e| {
            Error::bug(Phase::PreCommit, "cannot encode the key columns").with_source(e)
        })
    }

    /// The data file and position of `key`'s current row.
    #[cfg(test)]
    fn locate(&self, key: &[u8]) -> Option<(&str, u64)> {
        self.rows
            .get(key)
            .map(|l| (self.files[l.file as usize].path.as_str(), l.pos))
    }

    /// Points `key` at row `pos` of `file` (table state: used while building and catching up).
    pub(crate) fn insert(&mut self, key: &[u8], file: &Arc<IndexedFile>, pos: u64) {
        let location = self.location(file, pos);
        match self.rows.get_mut(key) {
            Some(slot) => *slot = location,
            None => {
                self.rows.insert(key.into(), location);
            }
        }
    }

    /// Records that the pre-commit of `checkpoint` puts `key` at row `pos` of `file` (`None`: deletes it), and
    /// returns the row it replaces, to be deleted.
    pub(crate) fn stage(
        &mut self,
        checkpoint: CheckpointId,
        key: &[u8],
        at: Option<(&Arc<IndexedFile>, u64)>,
    ) -> Option<Row> {
        let after = at.map(|(file, pos)| self.location(file, pos));
        let before = match after {
            Some(after) => self.rows.insert(key.into(), after),
            None => self.rows.remove(key),
        }
        .map(|l| self.row(l));
        let after = after.map(|l| self.row(l));
        let staged = self.staged.get_or_insert_with(|| (checkpoint, Vec::new()));
        staged.1.push(Change {
            key: key.into(),
            before: before.clone(),
            after,
        });
        before
    }

    /// The pre-committed checkpoint was decided (the next one begins): its changes stay, and are re-applied over
    /// a rebuild until the table shows the checkpoint.
    pub(crate) fn settle(&mut self) {
        if let Some(decided) = self.staged.take() {
            self.pending.push(decided);
        }
        if let Some(decided) = self.staged_compaction.take() {
            self.compactions.push(decided);
        }
    }

    /// The pre-committed checkpoint aborted: its changes are undone, newest first.
    pub(crate) fn undo(&mut self) {
        self.staged_compaction = None;
        let Some((_, changes)) = self.staged.take() else {
            return;
        };
        for change in changes.into_iter().rev() {
            self.put(change.key, change.before);
        }
    }

    /// Follows a schema change of `table`: when a key column's type changed (a widened `int` key), the index is
    /// rebuilt at its next use, and the changes of decided and staged checkpoints are encoded in the new types
    /// (they are re-applied over the rebuild).
    ///
    /// # Errors
    /// As [`new`](Self::new); [`Bug`](connector_api::ErrorKind::Bug) when a key does not convert to the new type (a schema
    /// change only widens).
    pub(crate) fn retype(&mut self, table: &Table, key: &[String]) -> Result<()> {
        let mut retyped = Self::new(table, key)?;
        if retyped.key_schema.fields() == self.key_schema.fields() {
            return Ok(());
        }
        let recode = |changes: Vec<Change>| -> Result<Vec<Change>> {
            if changes.is_empty() {
                return Ok(changes);
            }
            let parser = self.converter.parser();
            let columns = self
                .converter
                .convert_rows(changes.iter().map(|c| parser.parse(&c.key)))
                .map_err(|e| {
                    Error::bug(Phase::Setup, "cannot decode the indexed keys").with_source(e)
                })?;
            let columns = columns
                .iter()
                .zip(retyped.key_schema.fields())
                .map(|(c, f)| arrow_cast::cast(c, f.data_type()))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| {
                    Error::bug(Phase::Setup, "cannot widen the indexed keys").with_source(e)
                })?;
            let keys = RecordBatch::try_new(retyped.key_schema.clone(), columns).map_err(|e| {
                Error::bug(Phase::Setup, "cannot widen the indexed keys").with_source(e)
            })?;
            let rows = retyped.encode(&keys)?;
            Ok(changes
                .into_iter()
                .zip(rows.iter())
                .map(|(change, row)| Change {
                    key: row.as_ref().into(),
                    ..change
                })
                .collect())
        };
        let mut pending = Vec::with_capacity(self.pending.len());
        for (checkpoint, changes) in std::mem::take(&mut self.pending) {
            pending.push((checkpoint, recode(changes)?));
        }
        let staged = match self.staged.take() {
            Some((checkpoint, changes)) => Some((checkpoint, recode(changes)?)),
            None => None,
        };
        let rekey = |moves: &mut Moves| -> Result<()> {
            let keys = moves
                .keys()
                .map(|key| Change {
                    key: key.into(),
                    before: None,
                    after: None,
                })
                .collect();
            moves.rekey(recode(keys)?.into_iter().map(|c| c.key).collect());
            Ok(())
        };
        for (_, moves) in self
            .compactions
            .iter_mut()
            .chain(self.staged_compaction.iter_mut())
        {
            rekey(moves)?;
        }
        retyped.compactions = std::mem::take(&mut self.compactions);
        retyped.staged_compaction = self.staged_compaction.take();
        retyped.pending = pending;
        retyped.staged = staged;
        *self = retyped;
        Ok(())
    }

    /// Starts a rebuild: forgets every entry (the decided and staged changes stay, to be re-applied by
    /// [`finish_rebuild`](Self::finish_rebuild)).
    pub(crate) fn clear(&mut self) {
        self.files.clear();
        self.by_path.clear();
        self.rows.clear();
    }

    /// Ends a rebuild at `snapshot`, where this subtask's ledger shows `committed`: the changes of decided
    /// checkpoints the table does not show yet, and the staged ones, are applied again.
    pub(crate) fn finish_rebuild(
        &mut self,
        snapshot: Option<i64>,
        committed: Option<CheckpointId>,
    ) {
        self.caught_up(snapshot, committed);
        let mut changes: Vec<(Box<[u8]>, Option<Row>)> = Vec::new();
        for (_, checkpoint) in self.pending.iter().chain(self.staged.iter()) {
            changes.extend(checkpoint.iter().map(|c| (c.key.clone(), c.after.clone())));
        }
        for (key, after) in changes {
            self.put(key, after);
        }
        self.shown = Shown::At(snapshot);
    }

    /// Marks the index as showing `snapshot` (with this subtask's changes on top), where this subtask's ledger
    /// shows `committed`: the decided changes the table shows are no longer needed for a rebuild.
    pub(crate) fn caught_up(&mut self, snapshot: Option<i64>, committed: Option<CheckpointId>) {
        if let Some(committed) = committed {
            self.pending
                .retain(|(checkpoint, _)| *checkpoint > committed);
            // Shown committed: applied by the catch-up, read by a rebuild, or dropped at the commit.
            self.compactions
                .retain(|(checkpoint, _)| *checkpoint > committed);
        }
        self.shown = Shown::At(snapshot);
    }

    /// Records the compaction the pre-committed `checkpoint` carries ([`crate::live_compaction`]): its moves
    /// apply once the table shows it.
    pub(crate) fn stage_compaction(&mut self, checkpoint: CheckpointId, moves: Moves) {
        self.staged_compaction = Some((checkpoint, moves));
    }

    /// Whether the index holds the moves of `checkpoint`'s compaction (the table does not show it yet).
    pub(crate) fn knows_compaction(&self, checkpoint: CheckpointId) -> bool {
        self.compactions
            .iter()
            .chain(self.staged_compaction.iter())
            .any(|(c, _)| *c == checkpoint)
    }

    /// The table shows `checkpoint`'s compaction: every key still at a row it copied points at the copy (a key a
    /// later checkpoint or another writer moved on keeps its row).
    pub(crate) fn apply_compaction(&mut self, checkpoint: CheckpointId) {
        let Some(i) = self.compactions.iter().position(|(c, _)| *c == checkpoint) else {
            return;
        };
        let (_, moves) = self.compactions.remove(i);
        for (key, input, from, output, to) in moves.rows() {
            let Some(&file) = self.by_path.get(input) else {
                continue;
            };
            if self.rows.get(key) == Some(&Location { file, pos: from }) {
                let location = self.location(output, to);
                if let Some(slot) = self.rows.get_mut(key) {
                    *slot = location;
                }
            }
        }
    }

    /// The copy of `row` a compaction the table does not show yet made, if any: a position delete of `row` must
    /// delete it too ([`crate::compaction_moves`]).
    pub(crate) fn copy_of(&self, (file, pos): &Row) -> Option<Row> {
        self.compactions
            .iter()
            .chain(self.staged_compaction.iter())
            .find_map(|(_, moves)| moves.copy_of(&file.path, *pos))
    }

    /// The data files a compaction must not take now: those a decided checkpoint the table may not show deletes
    /// rows from (the rewrite would keep the row its delete names), and those a compaction the table does not
    /// show yet rewrites or writes. The files only the staged checkpoint deletes from are not busy: a compaction
    /// taking one drops the rows that checkpoint deletes ([`staged_deletes`](Self::staged_deletes)) from its
    /// outputs, so that the checkpoint's delete file, committed by the same snapshot, deletes nothing they hold.
    pub(crate) fn busy_besides_staged(&self) -> HashSet<String> {
        let mut busy = HashSet::new();
        for (_, changes) in &self.pending {
            busy.extend(
                changes
                    .iter()
                    .filter_map(|c| c.before.as_ref())
                    .map(|(file, _)| file.path.clone()),
            );
        }
        for (_, moves) in self.compactions.iter().chain(self.staged_compaction.iter()) {
            busy.extend(moves.inputs().iter().cloned());
            busy.extend(moves.outputs().map(str::to_string));
        }
        busy
    }

    /// The rows the staged checkpoint deletes (each replaced or deleted key's row before it), as sorted positions
    /// per data file path.
    pub(crate) fn staged_deletes(&self) -> HashMap<String, Vec<u64>> {
        let mut deletes: HashMap<String, Vec<u64>> = HashMap::new();
        if let Some((_, changes)) = &self.staged {
            for (file, position) in changes.iter().filter_map(|c| c.before.as_ref()) {
                deletes
                    .entry(file.path.clone())
                    .or_default()
                    .push(*position);
            }
        }
        for positions in deletes.values_mut() {
            positions.sort_unstable();
            positions.dedup();
        }
        deletes
    }

    /// How many keys point at each data file (canonical path): the file's rows the index still holds live, for a
    /// compaction's choice of files with many deleted rows. One pass over every key.
    pub(crate) fn rows_per_file(&self) -> HashMap<String, u64> {
        let mut counts = vec![0u64; self.files.len()];
        for location in self.rows.values() {
            counts[location.file as usize] += 1;
        }
        self.files
            .iter()
            .zip(counts)
            .filter(|(_, n)| *n > 0)
            .map(|(file, n)| (crate::location::canonical(&file.path), n))
            .collect()
    }

    /// The number of decided checkpoints whose changes the table may not show yet.
    #[cfg(test)]
    fn pending_checkpoints(&self) -> usize {
        self.pending.len()
    }

    /// Points `key` at `row`, or forgets it.
    fn put(&mut self, key: Box<[u8]>, row: Option<Row>) {
        match row {
            Some((file, pos)) => {
                let location = self.location(&file, pos);
                self.rows.insert(key, location);
            }
            None => {
                self.rows.remove(&key);
            }
        }
    }

    fn row(&self, location: Location) -> Row {
        (self.files[location.file as usize].clone(), location.pos)
    }

    fn location(&mut self, file: &Arc<IndexedFile>, pos: u64) -> Location {
        let file = match self.by_path.get(&file.path) {
            Some(&index) => index,
            None => {
                let index = u32::try_from(self.files.len()).expect("fewer than 2^32 data files");
                self.files.push(file.clone());
                self.by_path.insert(file.path.clone(), index);
                index
            }
        };
        Location { file, pos }
    }
}

/// The key columns of `table`, in its Arrow types with their field ids (required, as keys are).
fn key_schema(table: &Table, key: &[String]) -> Result<arrow_schema::SchemaRef> {
    let arrow =
        iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema()).map_err(|e| {
            iceberg_error(
                Phase::Setup,
                "cannot convert the table's schema to Arrow",
                e,
            )
        })?;
    let fields = key
        .iter()
        .map(|name| {
            arrow
                .field_with_name(name)
                .map(|f| f.clone().with_nullable(false))
                .map_err(|_| {
                    Error::config(format!(
                        "upsert_key: table {} has no column {name:?}",
                        table.identifier()
                    ))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(arrow_schema::Schema::new(fields)))
}

#[cfg(test)]
mod tests {
    use arrow_array::{ArrayRef, Int32Array, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use iceberg::spec::Struct;

    use super::*;

    fn index(fields: Vec<Field>) -> KeyIndex {
        let key_schema = Arc::new(Schema::new(fields));
        KeyIndex {
            converter: RowConverter::new(
                key_schema
                    .fields()
                    .iter()
                    .map(|f| SortField::new(f.data_type().clone()))
                    .collect(),
            )
            .unwrap(),
            key_schema,
            files: Vec::new(),
            by_path: HashMap::new(),
            rows: HashMap::new(),
            shown: Shown::Stale,
            pending: Vec::new(),
            staged: None,
            compactions: Vec::new(),
            staged_compaction: None,
        }
    }

    fn file(path: &str) -> Arc<IndexedFile> {
        Arc::new(IndexedFile {
            path: path.into(),
            spec_id: 0,
            partition: Struct::empty(),
        })
    }

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    #[test]
    fn an_int_key_and_its_widened_long_column_are_the_same_key() {
        let index = index(vec![Field::new("id", DataType::Int64, false)]);
        let narrow = index
            .keys(
                "t",
                &batch(vec![("id", Arc::new(Int32Array::from(vec![7, -1])))]),
            )
            .unwrap();
        let wide = index
            .keys(
                "t",
                &batch(vec![("id", Arc::new(Int64Array::from(vec![7, -1])))]),
            )
            .unwrap();
        assert_eq!(narrow.row(0).as_ref(), wide.row(0).as_ref());
        assert_eq!(narrow.row(1).as_ref(), wide.row(1).as_ref());
        assert_ne!(narrow.row(0).as_ref(), narrow.row(1).as_ref());
    }

    #[test]
    fn composite_keys_differ_by_any_column_and_never_run_into_each_other() {
        let index = index(vec![
            Field::new("a", DataType::Utf8, false),
            Field::new("b", DataType::Utf8, false),
        ]);
        let keys = index
            .keys(
                "t",
                &batch(vec![
                    ("b", Arc::new(StringArray::from(vec!["c", "", "bc"]))),
                    ("a", Arc::new(StringArray::from(vec!["ab", "abc", "a"]))),
                ]),
            )
            .unwrap();
        assert_ne!(keys.row(0).as_ref(), keys.row(1).as_ref());
        assert_ne!(keys.row(0).as_ref(), keys.row(2).as_ref());
        assert_ne!(keys.row(1).as_ref(), keys.row(2).as_ref());
    }

    #[test]
    fn a_staged_checkpoint_replaces_and_deletes_rows_and_an_abort_undoes_it() {
        let mut index = index(vec![Field::new("id", DataType::Int64, false)]);
        let keys = index
            .keys(
                "t",
                &batch(vec![("id", Arc::new(Int64Array::from(vec![1, 2, 3])))]),
            )
            .unwrap();
        let (one, two, three) = (keys.row(0), keys.row(1), keys.row(2));
        index.clear();
        index.insert(one.as_ref(), &file("a.parquet"), 0);
        index.insert(two.as_ref(), &file("a.parquet"), 1);
        index.finish_rebuild(Some(10), None);
        let c = CheckpointId(5);
        let replaced = index.stage(c, one.as_ref(), Some((&file("b.parquet"), 0)));
        assert_eq!(replaced, Some((file("a.parquet"), 0)));
        assert_eq!(
            index.stage(c, two.as_ref(), None),
            Some((file("a.parquet"), 1))
        );
        assert_eq!(
            index.stage(c, three.as_ref(), Some((&file("b.parquet"), 1))),
            None
        );
        // Changed twice in one checkpoint: undone to the state before the checkpoint, not the one in between.
        index.stage(c, one.as_ref(), Some((&file("b.parquet"), 2)));
        assert_eq!(index.len(), 2);
        index.undo();
        assert_eq!(index.locate(one.as_ref()), Some(("a.parquet", 0)));
        assert_eq!(index.locate(two.as_ref()), Some(("a.parquet", 1)));
        assert_eq!(index.locate(three.as_ref()), None);
    }

    #[test]
    fn decided_changes_survive_a_rebuild_until_the_table_shows_their_checkpoint() {
        let mut index = index(vec![Field::new("id", DataType::Int64, false)]);
        let keys = index
            .keys(
                "t",
                &batch(vec![("id", Arc::new(Int64Array::from(vec![1, 2])))]),
            )
            .unwrap();
        let (one, two) = (keys.row(0), keys.row(1));
        index.finish_rebuild(Some(1), None);
        index.stage(
            CheckpointId(3),
            one.as_ref(),
            Some((&file("c3.parquet"), 0)),
        );
        index.settle();
        index.stage(
            CheckpointId(4),
            two.as_ref(),
            Some((&file("c4.parquet"), 0)),
        );
        // A rebuild on a table that shows neither checkpoint 3 nor 4 yet.
        index.clear();
        index.finish_rebuild(Some(2), Some(CheckpointId(2)));
        assert_eq!(index.locate(one.as_ref()), Some(("c3.parquet", 0)));
        assert_eq!(index.locate(two.as_ref()), Some(("c4.parquet", 0)));
        assert_eq!(index.pending_checkpoints(), 1);
        // Once the table shows checkpoint 3, its changes come from the table.
        index.caught_up(Some(3), Some(CheckpointId(3)));
        assert_eq!(index.pending_checkpoints(), 0);
        index.undo();
        assert_eq!(index.locate(two.as_ref()), None);
    }

    #[test]
    fn a_compaction_moves_only_keys_still_at_its_rows_and_only_once_the_table_shows_it() {
        let mut index = index(vec![Field::new("id", DataType::Int64, false)]);
        let keys = index
            .keys(
                "t",
                &batch(vec![("id", Arc::new(Int64Array::from(vec![1, 2, 3])))]),
            )
            .unwrap();
        let (one, two, three) = (keys.row(0), keys.row(1), keys.row(2));
        index.clear();
        for (i, key) in [one, two, three].iter().enumerate() {
            index.insert(key.as_ref(), &file("a.parquet"), i as u64);
        }
        index.finish_rebuild(Some(1), Some(CheckpointId(1)));
        // Checkpoint 2 compacts a.parquet (all three rows copied to out.parquet).
        let mut moves = Moves::default();
        let a = moves.input("a.parquet");
        for (i, key) in [one, two, three].iter().enumerate() {
            moves.record(
                key.as_ref(),
                (a, i as u64),
                (&file("out.parquet"), i as u64),
            );
        }
        index.stage_compaction(CheckpointId(2), moves);
        assert!(index.busy_besides_staged().contains("a.parquet"));
        assert!(index.busy_besides_staged().contains("out.parquet"));
        index.settle();
        // Checkpoint 3, pre-committed before the table shows 2, replaces key 2: its row and the copy go.
        let replaced = index.stage(
            CheckpointId(3),
            two.as_ref(),
            Some((&file("c3.parquet"), 0)),
        );
        assert_eq!(replaced, Some((file("a.parquet"), 1)));
        assert_eq!(
            index.copy_of(&replaced.unwrap()),
            Some((file("out.parquet"), 1))
        );
        // The table shows checkpoint 2 with its compaction: keys 1 and 3 move, key 2 stays at checkpoint 3's row.
        index.apply_compaction(CheckpointId(2));
        index.caught_up(Some(2), Some(CheckpointId(2)));
        assert_eq!(index.locate(one.as_ref()), Some(("out.parquet", 0)));
        assert_eq!(index.locate(two.as_ref()), Some(("c3.parquet", 0)));
        assert_eq!(index.locate(three.as_ref()), Some(("out.parquet", 2)));
        assert!(!index.knows_compaction(CheckpointId(2)));
        assert!(index.copy_of(&(file("a.parquet"), 0)).is_none());
    }

    #[test]
    fn the_staged_checkpoints_deletes_are_told_apart_from_the_decided_ones() {
        let mut index = index(vec![Field::new("id", DataType::Int64, false)]);
        let keys = index
            .keys(
                "t",
                &batch(vec![("id", Arc::new(Int64Array::from(vec![1, 2, 3])))]),
            )
            .unwrap();
        let (one, two, three) = (keys.row(0), keys.row(1), keys.row(2));
        index.clear();
        index.insert(one.as_ref(), &file("a.parquet"), 0);
        index.insert(two.as_ref(), &file("b.parquet"), 0);
        index.insert(three.as_ref(), &file("b.parquet"), 1);
        index.finish_rebuild(Some(1), Some(CheckpointId(1)));
        // Checkpoint 2 (decided, not shown) replaces key 1; checkpoint 3 (staged) deletes keys 3 and 2.
        index.stage(
            CheckpointId(2),
            one.as_ref(),
            Some((&file("c2.parquet"), 0)),
        );
        index.settle();
        index.stage(CheckpointId(3), three.as_ref(), None);
        index.stage(CheckpointId(3), two.as_ref(), None);
        assert_eq!(
            index.staged_deletes(),
            HashMap::from([("b.parquet".to_string(), vec![0, 1])])
        );
        assert_eq!(
            index.busy_besides_staged(),
            HashSet::from(["a.parquet".to_string()])
        );
    }

    #[test]
    fn a_dropped_or_aborted_compaction_is_forgotten_and_moves_nothing() {
        let mut index = index(vec![Field::new("id", DataType::Int64, false)]);
        let keys = index
            .keys(
                "t",
                &batch(vec![("id", Arc::new(Int64Array::from(vec![1])))]),
            )
            .unwrap();
        let one = keys.row(0);
        index.clear();
        index.insert(one.as_ref(), &file("a.parquet"), 0);
        index.finish_rebuild(Some(1), Some(CheckpointId(1)));
        let compaction = || {
            let mut moves = Moves::default();
            let a = moves.input("a.parquet");
            moves.record(one.as_ref(), (a, 0), (&file("out.parquet"), 0));
            moves
        };
        // Aborted: gone with the staged checkpoint.
        index.stage_compaction(CheckpointId(2), compaction());
        index.undo();
        assert!(!index.knows_compaction(CheckpointId(2)));
        // Decided, then committed without the compaction (dropped at the commit): the table shows checkpoint 3
        // and no compaction step ever applies it.
        index.stage_compaction(CheckpointId(3), compaction());
        index.settle();
        assert!(index.knows_compaction(CheckpointId(3)));
        index.caught_up(Some(2), Some(CheckpointId(3)));
        assert!(!index.knows_compaction(CheckpointId(3)));
        assert_eq!(index.locate(one.as_ref()), Some(("a.parquet", 0)));
        assert!(index.busy_besides_staged().is_empty());
    }
}
