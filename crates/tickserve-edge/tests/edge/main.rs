//! The edge's pipeline without a socket: a runtime over the sample models,
//! the edge over it, and a payload the test decodes itself.

mod pipeline;
