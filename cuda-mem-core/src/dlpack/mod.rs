//! DLPack (feature `dlpack`): buffers and typed views out as versioned DLPack tensors, and
//! DLPack tensors of CUDA memory in as buffers.
//!
//! The C types and the owning tensor handle are the `dlpark` crate's (0.10, DLPack 1.3 headers,
//! default features off: it then depends on `bitflags` and `snafu` only): it has the versioned
//! `DLManagedTensorVersioned`, the legacy `DLManagedTensor`, an owning handle that calls the
//! deleter once on drop and allocations that keep shape and strides beside the header, and it
//! builds on this workspace's MSRV (1.88).
//!
//! | file | holds |
//! |---|---|
//! | `export` | [`ExportOptions`], [`ExportSource`], [`OwnedBy`], `Buffer::into_dlpack`, `DeviceView::to_dlpack`, [`export_dlpack`] |
//! | `tensor` | [`DlpackTensor`]: an exported tensor, until a consumer takes it |
//! | `import` | [`DlpackImport`] |
//! | `stream` | [`ConsumerStream`], [`RawStream`]: the stream exchange |
//! | `dtype` | [`DlpackElement`]: Rust element types and their DLPack data types |
//! | `layout` | shape and stride checks |
//! | `range` | an import's bytes against the driver's allocations |

mod dtype;
mod export;
mod import;
mod layout;
mod range;
mod stream;
mod tensor;

pub use dtype::DlpackElement;
pub use export::{ExportOptions, ExportSource, OwnedBy, export_dlpack, export_dlpack_as};
pub use import::DlpackImport;
pub use stream::{ConsumerStream, RawStream};
pub use tensor::DlpackTensor;
