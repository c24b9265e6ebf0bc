//! One module per subcommand.
pub mod chat;
pub mod generate;
pub mod inspect;
pub mod perplexity;
pub mod tokenize;
