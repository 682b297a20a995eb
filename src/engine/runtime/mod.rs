//! The engine's runtime layer: everything around the sans-IO core state that needs
//! threads, tasks, queues, shared memory or the operating system.
//!
//! | module | owns |
//! |---|---|
//! | `builder` | [`EngineBuilder`]: the options, preparation of the shared state, the start |
//! | `config` | the settings, declared and validated once; [`BuildError`], [`Cores`] |
//! | `lifecycle` | [`Engine`]: cores started pinned or hosted, drain, shutdown |
//! | `handle` | [`EngineHandle`]: reports, statistics readers, memory figures (its request methods are `request`'s) |
//! | `request` | [`RequestBuilder`], [`Request`], [`Batch`], `EngineHandle::{request, submit, submit_batch}`: validation, the PDU's source |
//! | `submit` | the one way in: the gate, the per-core lock-free queues and the messages they carry, the thread's core, a request's slot and queue place |
//! | `completion` | the completion slots (PDU in, outcome out), the PDU's store and its one encoder, [`Completion`] |
//! | `shared` | what the handle and the cores share; statistics publication |
//! | `turn` | `Core::turn`: one turn of a core, for both schedulers: queue → core state, I/O, outcomes → slots and one wake of the callers |
//! | `core_setup` | a core's construction, shutdown and faults (the cold side of `turn`) |
//! | `sink` | the transmit sinks a turn hands its state (to the I/O layer's send queue) |
//! | `pinned`, `hosted` | the two schedulers: a pinned thread, a task on a Tokio runtime |
//! | `membership` | the endpoint snapshot and the DNS discovery thread |
//! | `consts` | the layer's constants, each with its reason |

mod builder;
mod completion;
mod config;
pub(crate) mod consts;
mod core_setup;
mod handle;
mod hosted;
mod lifecycle;
mod membership;
mod pinned;
mod request;
mod shared;
mod sink;
mod submit;
mod turn;

pub use self::builder::EngineBuilder;
pub use self::completion::Completion;
pub use self::config::{BuildError, Cores, DnsConfig, OptionError};
pub use self::consts::{DEFAULT_IO_BACKEND, DEFAULT_SOCKET_BUFFER, MAX_SOCKETS_PER_CORE};
pub use self::handle::EngineHandle;
pub use self::lifecycle::Engine;
pub use self::request::{Batch, Request, RequestBuilder};
#[cfg(feature = "loom")]
pub(crate) use self::{
    completion::loom_models as completion_models, submit::loom_models as submit_models,
};
