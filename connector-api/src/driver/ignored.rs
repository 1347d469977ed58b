//! `evolution = "ignore"`: a sink whose table never changes, given batches that may carry columns it lacks. The
//! columns the table lacked when the sink was built ([`SinkBuilder::lacking_columns`](crate::SinkBuilder::lacking_columns)),
//! and every column the batches gain while it runs, are left out of what it writes; the values left out are counted
//! ([`IGNORED_VALUES`](crate::metrics::IGNORED_VALUES)) and the columns named in the log once per schema.
//!
//! The projection is by name, so it holds whatever order the batches' columns come in. The sink itself runs with
//! `evolution = "ignore"`, which changes nothing in its table: a column it keeps whose type the batches change is
//! refused by the sink's own [`evolve`](crate::TwoPhaseCommit::evolve), naming the column (the source refuses such
//! changes first: a job with an `ignore` sink follows the writers only as far as `add-columns`).

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Array, RecordBatch};
use arrow_schema::{Schema, SchemaRef};
use async_trait::async_trait;

use super::erased::{ErasedSink, PendingCommit};
use crate::{CheckpointId, DeliveryGuarantee, Error, ErrorKind, Phase, Result, SinkId};

/// The columns of one batch schema a sink keeps, and the ones it leaves out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Kept {
    /// The batch schema this projection is for.
    batches: SchemaRef,
    /// The indices of the kept columns in `batches`, in order.
    indices: Vec<usize>,
    /// The kept columns' schema: what the sink is built for, or evolves to.
    schema: SchemaRef,
    /// The left-out columns: their index in `batches` and name.
    left_out: Vec<(usize, String)>,
}

impl Kept {
    /// Keeps every column of `batches` but the ones named in `lacking`.
    pub(crate) fn without(batches: SchemaRef, lacking: &[String]) -> Result<Self> {
        let keep = |name: &str| !lacking.iter().any(|l| l == name);
        Self::keeping(batches, keep)
    }

    /// Keeps the columns of `batches` that `kept` names (the ones the sink was built with), in `kept`'s order.
    fn among(batches: SchemaRef, kept: &Schema) -> Result<Self> {
        let mut among = Self::keeping(batches.clone(), |name| kept.field_with_name(name).is_ok())?;
        among.indices = kept
            .fields()
            .iter()
            .filter_map(|f| batches.index_of(f.name()).ok())
            .collect();
        among.schema = std::sync::Arc::new(batches.project(&among.indices).map_err(|e| {
            Error::bug(Phase::Setup, "the columns evolution = \"ignore\" keeps").with_source(e)
        })?);
        Ok(among)
    }

    fn keeping(batches: SchemaRef, keep: impl Fn(&str) -> bool) -> Result<Self> {
        let (kept, left): (Vec<usize>, Vec<usize>) =
            (0..batches.fields().len()).partition(|&i| keep(batches.field(i).name()));
        // A change stream's operation (or unavailable-columns) column is how the sink tells deletes and partial
        // rows: leaving it out would write deletes as rows.
        if let Some(&i) = left.iter().find(|&&i| {
            batches
                .field(i)
                .metadata()
                .contains_key(crate::CHANGE_COLUMN)
        }) {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!(
                    "the sink's table lacks the change stream's column {:?}, which evolution = \"ignore\" cannot \
                     leave out (the sink would apply deletes as rows): add it to the table, or let the sink key \
                     its rows (an upsert mode)",
                    batches.field(i).name()
                ),
            ));
        }
        let schema = batches.project(&kept).map_err(|e| {
            Error::bug(Phase::Setup, "the columns evolution = \"ignore\" keeps").with_source(e)
        })?;
        let left_out = left
            .into_iter()
            .map(|i| (i, batches.field(i).name().clone()))
            .collect();
        Ok(Self {
            batches,
            indices: kept,
            schema: std::sync::Arc::new(schema),
            left_out,
        })
    }

    /// The schema of what the sink receives.
    pub(crate) fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The names of the columns left out.
    pub(crate) fn left_out(&self) -> Vec<&str> {
        self.left_out.iter().map(|(_, n)| n.as_str()).collect()
    }

    /// `batch` (of the batch schema this is for) without the left-out columns.
    fn project(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        if self.left_out.is_empty() {
            return Ok(batch.clone());
        }
        batch.project(&self.indices).map_err(|e| {
            Error::bug(Phase::Write, "the columns evolution = \"ignore\" keeps").with_source(e)
        })
    }
}

/// A sink run with `evolution = "ignore"`: writes go to it without the columns it leaves out ([`Kept`]).
pub(crate) struct IgnoringSink {
    inner: Box<dyn ErasedSink>,
    kept: Kept,
}

impl IgnoringSink {
    /// Wraps `inner`, built for [`Kept::schema`] of `kept`.
    pub(crate) fn new(inner: Box<dyn ErasedSink>, kept: Kept) -> Self {
        let sink = Self { inner, kept };
        sink.log_left_out();
        sink
    }

    fn log_left_out(&self) {
        if !self.kept.left_out.is_empty() {
            tracing::info!(sink = %self.inner.sink_id(), columns = %self.kept.left_out().join(", "),
                "evolution = \"ignore\": these columns of the batches are left out (the sink's table lacks them)");
        }
    }
}

/// Counts the values `batch` carries in the columns `kept` leaves out (nulls are not values).
fn count_left_out(sink: &SinkId, kept: &Kept, batch: &RecordBatch) {
    for (index, name) in &kept.left_out {
        let column = batch.column(*index);
        let values = (column.len() - column.null_count()) as u64;
        if values > 0 {
            metrics::counter!(crate::metrics::IGNORED_VALUES, "sink" => sink.to_string(),
                "column" => name.clone())
            .increment(values);
        }
    }
}

#[async_trait]
impl ErasedSink for IgnoringSink {
    fn sink_id(&self) -> &SinkId {
        self.inner.sink_id()
    }

    fn transaction_timeout(&self) -> Option<Duration> {
        self.inner.transaction_timeout()
    }

    fn delivery(&self) -> DeliveryGuarantee {
        self.inner.delivery()
    }

    fn holds_deferred(&self) -> bool {
        self.inner.holds_deferred()
    }

    async fn recorded_checkpoint(&mut self) -> Result<Option<CheckpointId>> {
        self.inner.recorded_checkpoint().await
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        self.inner.begin(checkpoint).await
    }

    /// Writes `batch` without the left-out columns (found by name when its schema is not the one the sink was
    /// given last, by [`evolve`](ErasedSink::evolve) or when built).
    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let other;
        let schema = batch.schema_ref();
        // The usual batch shares the schema the sink was given (one Arc): no field-by-field compare.
        let kept = match Arc::ptr_eq(schema, &self.kept.batches) || **schema == *self.kept.batches {
            true => &self.kept,
            false => {
                other = Kept::among(schema.clone(), &self.kept.schema)?;
                &other
            }
        };
        count_left_out(self.inner.sink_id(), kept, batch);
        let projected = kept.project(batch)?;
        self.inner.write(&projected).await
    }

    async fn write_tombstones(&mut self, keys: &[Option<Vec<u8>>]) -> Result<bool> {
        self.inner.write_tombstones(keys).await
    }

    /// Keeps the columns it kept and leaves out the rest of `schema`; the sink evolves only if a kept column's
    /// type changed (which its `ignore` evolution refuses, naming the column), or one it kept is gone.
    async fn evolve(&mut self, schema: SchemaRef) -> Result<()> {
        let kept = Kept::among(schema, &self.kept.schema)?;
        if kept.schema != self.kept.schema {
            self.inner.evolve(kept.schema()).await?;
        }
        let newly: Vec<&str> = kept
            .left_out()
            .into_iter()
            .filter(|n| !self.kept.left_out().contains(n))
            .collect();
        if !newly.is_empty() {
            tracing::info!(sink = %self.inner.sink_id(), columns = %newly.join(", "),
                "evolution = \"ignore\": the batches' new columns are left out");
        }
        self.kept = kept;
        Ok(())
    }

    async fn pre_commit(
        &mut self,
        checkpoint: CheckpointId,
    ) -> Result<(serde_json::Value, Box<dyn PendingCommit>)> {
        self.inner.pre_commit(checkpoint).await
    }

    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }

    async fn recover(
        &mut self,
        restored: Option<(CheckpointId, serde_json::Value)>,
        committed: bool,
    ) -> Result<()> {
        self.inner.recover(restored, committed).await
    }

    async fn inspect(
        &mut self,
        restored: Option<(CheckpointId, serde_json::Value)>,
        committed: bool,
    ) -> Result<crate::PlanSummary> {
        self.inner.inspect(restored, committed).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use arrow_array::{ArrayRef, Int32Array, Int64Array, StringArray};
    use arrow_schema::{DataType, Field};

    use super::*;
    use crate::ErrorKind;

    /// What the wrapped sink was given.
    #[derive(Default)]
    struct Seen {
        written: Vec<RecordBatch>,
        evolved: Vec<SchemaRef>,
        /// Whether `evolve` refuses, as a sink whose evolution does not allow the change does.
        refuse: bool,
    }

    struct Recording {
        id: SinkId,
        seen: Arc<Mutex<Seen>>,
    }

    #[async_trait]
    impl ErasedSink for Recording {
        fn sink_id(&self) -> &SinkId {
            &self.id
        }
        fn transaction_timeout(&self) -> Option<Duration> {
            None
        }
        fn delivery(&self) -> DeliveryGuarantee {
            DeliveryGuarantee::ExactlyOnce
        }
        fn holds_deferred(&self) -> bool {
            false
        }
        async fn recorded_checkpoint(&mut self) -> Result<Option<CheckpointId>> {
            Ok(None)
        }
        async fn begin(&mut self, _: CheckpointId) -> Result<()> {
            Ok(())
        }
        async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
            self.seen.lock().unwrap().written.push(batch.clone());
            Ok(())
        }
        async fn write_tombstones(&mut self, _: &[Option<Vec<u8>>]) -> Result<bool> {
            Ok(false)
        }
        async fn evolve(&mut self, schema: SchemaRef) -> Result<()> {
            let mut seen = self.seen.lock().unwrap();
            if seen.refuse {
                return Err(Error::config("the batches widen column \"id\""));
            }
            seen.evolved.push(schema);
            Ok(())
        }
        async fn pre_commit(
            &mut self,
            _: CheckpointId,
        ) -> Result<(serde_json::Value, Box<dyn PendingCommit>)> {
            Err(Error::bug(Phase::PreCommit, "not in this test"))
        }
        async fn abort(&mut self) -> Result<()> {
            Ok(())
        }
        async fn recover(
            &mut self,
            _: Option<(CheckpointId, serde_json::Value)>,
            _: bool,
        ) -> Result<()> {
            Ok(())
        }
        async fn inspect(
            &mut self,
            _: Option<(CheckpointId, serde_json::Value)>,
            _: bool,
        ) -> Result<crate::PlanSummary> {
            Err(Error::bug(Phase::Recover, "not in this test"))
        }
    }

    fn schema(fields: &[(&str, DataType)]) -> SchemaRef {
        Arc::new(Schema::new(
            fields
                .iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        ))
    }

    fn batch(schema: &SchemaRef, ids: &[i32], notes: &[Option<&str>]) -> RecordBatch {
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Int32 => Arc::new(Int32Array::from(ids.to_vec())) as ArrayRef,
                DataType::Int64 => Arc::new(Int64Array::from(
                    ids.iter().map(|&i| i64::from(i)).collect::<Vec<_>>(),
                )),
                _ => Arc::new(StringArray::from(notes.to_vec())),
            })
            .collect();
        RecordBatch::try_new(schema.clone(), columns).unwrap()
    }

    fn ignoring(batches: &SchemaRef, lacking: &[&str]) -> (IgnoringSink, Arc<Mutex<Seen>>) {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let inner = Recording {
            id: SinkId::new("orders-db").unwrap(),
            seen: seen.clone(),
        };
        let lacking: Vec<String> = lacking.iter().map(|s| s.to_string()).collect();
        let kept = Kept::without(batches.clone(), &lacking).unwrap();
        (IgnoringSink::new(Box::new(inner), kept), seen)
    }

    fn names(schema: &Schema) -> Vec<String> {
        schema.fields().iter().map(|f| f.name().clone()).collect()
    }

    #[test]
    fn keeps_every_column_but_the_lacking_ones_in_order() {
        let batches = schema(&[
            ("id", DataType::Int32),
            ("note", DataType::Utf8),
            ("qty", DataType::Int32),
        ]);
        let kept = Kept::without(batches, &["note".to_string()]).unwrap();
        assert_eq!(names(&kept.schema()), ["id", "qty"]);
        assert_eq!(kept.left_out(), ["note"]);
    }

    #[tokio::test]
    async fn writes_leave_out_the_lacking_columns_and_the_ones_gained_while_running() {
        let first = schema(&[("id", DataType::Int32), ("note", DataType::Utf8)]);
        let (mut sink, seen) = ignoring(&first, &["note"]);
        sink.write(&batch(&first, &[1, 2], &[Some("a"), None]))
            .await
            .unwrap();
        // The batches gain a column: the sink is not evolved, and the new column is left out too.
        let gained = schema(&[
            ("id", DataType::Int32),
            ("note", DataType::Utf8),
            ("extra", DataType::Utf8),
        ]);
        sink.evolve(gained.clone()).await.unwrap();
        assert_eq!(sink.kept.left_out(), ["note", "extra"]);
        sink.write(&batch(&gained, &[3], &[Some("b")]))
            .await
            .unwrap();
        let seen = seen.lock().unwrap();
        assert!(seen.evolved.is_empty(), "the table never changes");
        let written: Vec<Vec<String>> = seen.written.iter().map(|b| names(&b.schema())).collect();
        assert_eq!(written, [vec!["id"], vec!["id"]]);
        let ids = seen.written[1]
            .column(0)
            .as_any()
            .downcast_ref::<Int32Array>()
            .unwrap();
        assert_eq!(ids.values(), &[3]);
    }

    #[tokio::test]
    async fn a_batch_of_an_equal_but_other_schema_is_projected_by_name() {
        let first = schema(&[("id", DataType::Int32), ("note", DataType::Utf8)]);
        let (mut sink, seen) = ignoring(&first, &["note"]);
        // The same columns in another order, with metadata: projected by name, in the sink's order.
        let other = Arc::new(
            Schema::new(vec![
                Field::new("note", DataType::Utf8, true),
                Field::new("id", DataType::Int32, true),
            ])
            .with_metadata([("k".to_string(), "v".to_string())].into()),
        );
        sink.write(&batch(&other, &[7], &[Some("x")]))
            .await
            .unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(names(&seen.written[0].schema()), ["id"]);
    }

    #[tokio::test]
    async fn a_kept_column_whose_type_changed_goes_to_the_sink_which_decides() {
        let first = schema(&[("id", DataType::Int32), ("note", DataType::Utf8)]);
        let (mut sink, seen) = ignoring(&first, &[]);
        let widened = schema(&[("id", DataType::Int64), ("note", DataType::Utf8)]);
        sink.evolve(widened.clone()).await.unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.evolved, [widened]);
    }

    #[test]
    fn a_change_stream_s_operation_column_is_never_left_out() {
        let op = Field::new(crate::OP_COLUMN, DataType::Utf8, false)
            .with_metadata([(crate::CHANGE_COLUMN.to_string(), "op".to_string())].into());
        let batches = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            op,
        ]));
        let err = Kept::without(batches, &[crate::OP_COLUMN.to_string()]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.to_string().contains("deletes as rows"), "{err}");
    }

    #[tokio::test]
    async fn a_sink_refusing_the_change_stops_the_evolve() {
        let first = schema(&[("id", DataType::Int32)]);
        let (mut sink, seen) = ignoring(&first, &[]);
        seen.lock().unwrap().refuse = true;
        let err = sink
            .evolve(schema(&[("id", DataType::Int64)]))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert_eq!(sink.kept.schema(), first, "the projection stays as it was");
    }
}
