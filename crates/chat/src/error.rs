//! Errors from compiling or rendering a chat template.

use thiserror::Error;

/// What went wrong while compiling or rendering a chat template.
///
/// Every variant names the problem: the template's own words for
/// [`ChatError::Raised`], the engine's description plus the template line
/// for the others.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ChatError {
    /// The template source does not parse (bad Jinja syntax).
    #[error("chat template syntax error at line {line}: {message}")]
    Syntax {
        /// 1-based line in the template source.
        line: usize,
        /// The parser's description of the problem.
        message: String,
    },
    /// The template called `raise_exception(msg)`: it rejected the
    /// conversation (for example an unsupported role order).
    #[error("chat template rejected the conversation: {0}")]
    Raised(String),
    /// Rendering failed inside the template (unknown filter, bad operand
    /// types, undefined variable used as a value, ...).
    #[error("chat template render error{}: {message}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    Render {
        /// 1-based line in the template source, when known.
        line: Option<usize>,
        /// The engine's description of the problem.
        message: String,
    },
}

/// Marker attached as the source of the engine error that
/// `raise_exception` produces, so it can be told apart from engine
/// failures after rendering unwinds.
#[derive(Debug)]
pub(crate) struct RaisedException(pub(crate) String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

impl ChatError {
    /// Classifies an engine error from compiling (`compiling = true`) or
    /// rendering a template.
    pub(crate) fn from_engine(err: minijinja::Error, compiling: bool) -> Self {
        // A raise_exception() anywhere in the source chain wins.
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
        while let Some(e) = source {
            if let Some(raised) = e.downcast_ref::<RaisedException>() {
                return ChatError::Raised(raised.0.clone());
            }
            source = e.source();
        }
        let message = describe(&err);
        if compiling || err.kind() == minijinja::ErrorKind::SyntaxError {
            ChatError::Syntax {
                line: err.line().unwrap_or(0),
                message,
            }
        } else {
            ChatError::Render {
                line: err.line(),
                message,
            }
        }
    }
}

/// The engine's message without its "(in template:line)" suffix (the line
/// is reported separately), followed by any nested causes.
fn describe(err: &minijinja::Error) -> String {
    let mut message = match err.detail() {
        Some(detail) => format!("{}: {}", err.kind(), detail),
        None => err.kind().to_string(),
    };
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        message.push_str(": ");
        message.push_str(&e.to_string());
        source = e.source();
    }
    message
}
