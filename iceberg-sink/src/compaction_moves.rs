//! Where a compaction of an upsert table moved each key's row ([`crate::live_compaction`]): recorded while the
//! inputs are rewritten at a pre-commit, kept by the key index ([`crate::key_index::KeyIndex::stage_compaction`])
//! until the table shows the checkpoint that carries the compaction.
//!
//! Two uses, both needed because a compaction may land or be dropped at its commit:
//! - once the table shows the compaction, every key still pointing at a rewritten row is pointed at its copy;
//! - until then, a later checkpoint that deletes such a row by position also deletes its copy
//!   ([`Moves::copy_of`]): whichever way the compaction ends, the row is deleted (a delete naming a file that never
//!   became live, or one a snapshot removed, changes nothing).

use std::collections::HashMap;
use std::sync::Arc;

use crate::indexed_file::{IndexedFile, Row};

/// One row the compaction copied: its key, where it was (input index, position) and where its copy is (output
/// index, position).
#[derive(Debug)]
struct Moved {
    key: Box<[u8]>,
    input: u32,
    from: u64,
    output: u32,
    to: u64,
}

/// The rows one compaction copied, by input and position.
#[derive(Debug, Default)]
pub(crate) struct Moves {
    inputs: Vec<String>,
    input_index: HashMap<String, u32>,
    outputs: Vec<Arc<IndexedFile>>,
    output_index: HashMap<String, u32>,
    moved: Vec<Moved>,
    /// (input, position) → index into `moved`.
    by_row: HashMap<(u32, u64), u32>,
}

impl Moves {
    /// Registers an input file (also one none of whose rows is copied: every row deleted) and returns its index.
    pub(crate) fn input(&mut self, path: &str) -> u32 {
        if let Some(&i) = self.input_index.get(path) {
            return i;
        }
        let i = u32::try_from(self.inputs.len()).expect("fewer than 2^32 inputs");
        self.inputs.push(path.to_string());
        self.input_index.insert(path.to_string(), i);
        i
    }

    /// Records that row `from` of input `input` (holding `key`) was copied to row `to` of `output`.
    pub(crate) fn record(
        &mut self,
        key: &[u8],
        (input, from): (u32, u64),
        (output, to): (&Arc<IndexedFile>, u64),
    ) {
        let output = match self.output_index.get(&output.path) {
            Some(&o) => o,
            None => {
                let o = u32::try_from(self.outputs.len()).expect("fewer than 2^32 outputs");
                self.outputs.push(output.clone());
                self.output_index.insert(output.path.clone(), o);
                o
            }
        };
        let index = u32::try_from(self.moved.len()).expect("fewer than 2^32 moved rows");
        self.by_row.insert((input, from), index);
        self.moved.push(Moved {
            key: key.into(),
            input,
            from,
            output,
            to,
        });
    }

    /// The copy of row `pos` of `path`, when it is one this compaction copied.
    pub(crate) fn copy_of(&self, path: &str, pos: u64) -> Option<Row> {
        let input = *self.input_index.get(path)?;
        let moved = &self.moved[*self.by_row.get(&(input, pos))? as usize];
        Some((self.outputs[moved.output as usize].clone(), moved.to))
    }

    /// The rewritten files' paths.
    pub(crate) fn inputs(&self) -> &[String] {
        &self.inputs
    }

    /// The files the copies are in.
    pub(crate) fn outputs(&self) -> impl Iterator<Item = &str> {
        self.outputs.iter().map(|f| f.path.as_str())
    }

    /// How many rows were copied.
    pub(crate) fn len(&self) -> usize {
        self.moved.len()
    }

    /// Every copied row: its key, the input path and position, the output file and position.
    pub(crate) fn rows(&self) -> impl Iterator<Item = (&[u8], &str, u64, &Arc<IndexedFile>, u64)> {
        self.moved.iter().map(|m| {
            (
                &*m.key,
                self.inputs[m.input as usize].as_str(),
                m.from,
                &self.outputs[m.output as usize],
                m.to,
            )
        })
    }

    /// The keys, in recording order (for re-encoding them in widened key types).
    pub(crate) fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.moved.iter().map(|m| &*m.key)
    }

    /// Replaces the keys by `keys` (the same rows, re-encoded), in recording order.
    pub(crate) fn rekey(&mut self, keys: Vec<Box<[u8]>>) {
        debug_assert_eq!(keys.len(), self.moved.len());
        for (moved, key) in self.moved.iter_mut().zip(keys) {
            moved.key = key;
        }
    }

    /// The heap the moves hold, in bytes, as [`crate::key_index::KeyIndex::heap_bytes`] counts.
    pub(crate) fn heap_bytes(&self, chunk: impl Fn(usize) -> usize) -> usize {
        let moved = chunk(self.moved.capacity() * std::mem::size_of::<Moved>())
            + self.moved.iter().map(|m| chunk(m.key.len())).sum::<usize>();
        let by_row = chunk(self.by_row.capacity() * (std::mem::size_of::<((u32, u64), u32)>() + 1));
        moved + by_row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> Arc<IndexedFile> {
        Arc::new(IndexedFile {
            path: path.into(),
            spec_id: 0,
            partition: iceberg::spec::Struct::empty(),
        })
    }

    #[test]
    fn a_copied_row_is_found_by_its_input_and_position_and_others_are_not() {
        let mut moves = Moves::default();
        let a = moves.input("a.parquet");
        let dead = moves.input("dead.parquet");
        let out = file("out.parquet");
        moves.record(b"k1", (a, 0), (&out, 0));
        moves.record(b"k3", (a, 2), (&out, 1));
        assert_eq!(moves.input("a.parquet"), a);
        assert_eq!(
            moves
                .copy_of("a.parquet", 2)
                .map(|(f, p)| (f.path.clone(), p)),
            Some(("out.parquet".into(), 1))
        );
        assert!(
            moves.copy_of("a.parquet", 1).is_none(),
            "row 1 was deleted, not copied"
        );
        assert!(moves.copy_of("dead.parquet", 0).is_none());
        assert!(moves.copy_of("other.parquet", 0).is_none());
        assert_eq!(moves.inputs(), ["a.parquet", "dead.parquet"]);
        assert_eq!(dead, 1);
        assert_eq!(moves.len(), 2);
        moves.rekey(vec![b"K1".as_slice().into(), b"K3".as_slice().into()]);
        assert_eq!(moves.keys().collect::<Vec<_>>(), [b"K1".as_slice(), b"K3"]);
    }
}
