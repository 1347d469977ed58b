//! Static membership: the process is told which share of the job it runs (`--member i --of M`, or the ordinal at
//! the end of a StatefulSet pod name or a systemd instance name) and runs the subtasks `s % M == i`, with no
//! coordination at all: no lease tables, nothing moves when a process restarts (its subtasks wait for it), and a
//! rolling restart moves nothing.
//!
//! Safety is the checkpoint store's claims, as in every mode: a process that starts a subtask claims it, fencing
//! every earlier owner. Two processes given the same member (two pods with one ordinal) therefore never both
//! decide a checkpoint: the later claim wins, and the earlier process, finding its subtask taken over, stops it
//! for good and reports the duplicate (log and `/health`) instead of claiming it back.

use std::collections::BTreeSet;

use anyhow::{Result, bail};
use async_trait::async_trait;

use super::{Assignment, Membership};

/// Member `index` of `of`: the subtasks `s % of == index` of a job of `subtasks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaticShare {
    /// This process's member number, `0..of`.
    pub index: u32,
    /// How many members share the job.
    pub of: u32,
    subtasks: u32,
}

impl StaticShare {
    /// Member `member` of `of` in a job of `subtasks`. `member` is a number, or a name ending in `-<n>` or `@<n>`
    /// (a StatefulSet pod `ratchet-2`, a systemd instance `ratchet@2`): the ordinal is taken from its end.
    ///
    /// # Errors
    /// A member that is not a number and does not end in one, `of` of 0, or a member not below `of`, each named
    /// with what to pass instead.
    pub fn new(member: &str, of: u32, subtasks: u32) -> Result<Self> {
        let ordinal = member
            .rsplit(['-', '@'])
            .next()
            .and_then(|n| n.parse::<u32>().ok());
        let Some(index) = ordinal else {
            bail!(
                "--member {member:?} is neither a number nor a name ending in one (a StatefulSet pod name such \
                 as ratchet-2, a systemd instance such as ratchet@2)"
            );
        };
        if of == 0 {
            bail!("--of must be at least 1: the number of members sharing the job");
        }
        if index >= of {
            bail!(
                "--member {member:?} is member {index}, but --of {of} numbers members 0 to {}",
                of - 1
            );
        }
        if of > subtasks {
            tracing::warn!(
                of,
                subtasks,
                "more members than subtasks: members {subtasks} and above run nothing"
            );
        }
        Ok(Self {
            index,
            of,
            subtasks,
        })
    }

    /// The subtasks this member runs.
    pub fn subtasks(&self) -> BTreeSet<u32> {
        (0..self.subtasks)
            .filter(|s| s % self.of == self.index)
            .collect()
    }
}

#[async_trait]
impl Membership for StaticShare {
    /// Always the member's subtasks: nothing is renewed, nothing expires.
    async fn renew(&self) -> Result<Assignment> {
        let held = self.subtasks();
        Ok(Assignment {
            handing: BTreeSet::new(),
            quota: held.len(),
            held,
            members: self.of as usize,
        })
    }

    /// Nothing to give up: a stopped subtask waits for its member.
    async fn release(&self, _subtask: u32) -> Result<()> {
        Ok(())
    }

    async fn leave(&self) -> Result<()> {
        Ok(())
    }

    fn mode(&self) -> String {
        format!("static member {} of {}", self.index, self.of)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ordinal_comes_from_a_number_a_pod_name_or_an_instance_name() {
        for (member, index) in [
            ("1", 1),
            ("ratchet-2", 2),
            ("orders-ratchet-0", 0),
            ("ratchet@2", 2),
        ] {
            assert_eq!(
                StaticShare::new(member, 3, 6).unwrap().index,
                index,
                "{member}"
            );
        }
        let share = StaticShare::new("ratchet-1", 3, 7).unwrap();
        assert_eq!(share.subtasks(), BTreeSet::from([1, 4]));
        for (member, of, expected) in [
            ("ratchet", 3, "neither a number"),
            ("3", 3, "numbers members 0 to 2"),
            ("0", 0, "at least 1"),
        ] {
            let err = StaticShare::new(member, of, 6).unwrap_err();
            assert!(err.to_string().contains(expected), "{member}/{of}: {err}");
        }
    }
}
