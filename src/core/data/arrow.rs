//! The part of Apache Arrow synth uses, named from Arrow's own crates rather than the
//! `arrow` umbrella crate: the umbrella also compiles arithmetic, string and row-format
//! kernels synth never calls (about a minute of a cold build, BENCHMARKS.md "Cold build").
//! The module paths are the umbrella's (`array`, `datatypes`, `compute`, ...), so code
//! reads as it would with `arrow::`.

/// Arrays, record batches, builders and the downcasts (`AsArray`, `as_string`, ...).
pub mod array {
    pub use arrow_array::builder::*;
    pub use arrow_array::cast::*;
    pub use arrow_array::iterator::*;
    pub use arrow_array::*;
    pub use arrow_data::ArrayData;
}

/// Data types, fields and schemas; the primitive type markers (`Int64Type`, ...).
pub mod datatypes {
    pub use arrow_array::types::*;
    pub use arrow_array::{ArrowNativeTypeOp, ArrowNumericType, ArrowPrimitiveType};
    pub use arrow_buffer::{ArrowNativeType, ToByteSlice, i256};
    pub use arrow_schema::{
        DataType, Field, FieldRef, Fields, IntervalUnit, Metadata, Schema, SchemaBuilder, SchemaRef, TimeUnit,
        UnionFields, UnionMode,
    };
}

/// The kernels synth calls: casts, and selection (filter, take, interleave, concat).
pub mod compute {
    pub use arrow_cast::cast::*;
    pub use arrow_select::concat::*;
    pub use arrow_select::filter::*;
    pub use arrow_select::interleave::*;
    pub use arrow_select::take::*;
}

/// Display of values and whole batches.
pub mod util {
    pub use arrow_cast::{display, pretty};
}

/// Arrow's error type.
pub mod error {
    pub use arrow_schema::ArrowError;
}

pub use arrow_json as json;
