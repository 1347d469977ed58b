//! What a job keeps in its checkpoint store besides the checkpoint records: its identity and subtask count, its
//! layout generations, its partition layout, and the bounded calls that read and write them.

pub mod generations;
pub mod layout;
pub mod store;
pub mod store_calls;
