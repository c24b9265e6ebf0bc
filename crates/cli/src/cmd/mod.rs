//! One module per subcommand.
pub mod bench;
pub mod chat;
pub mod generate;
pub mod inspect;
pub mod perplexity;
pub mod quantize;
pub mod serve;
pub mod plan;
pub mod plan_ring;
pub mod plan_tp;
pub mod profile;
pub mod synth;
pub mod tokenize;
pub mod worker;
