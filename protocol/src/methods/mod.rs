//! Every method and notification of the contract: its name and its typed params and result.
//!
//! A method is a zero-sized type implementing [`Method`] (e.g. [`Generate`]); a notification one
//! implementing [`NotificationMethod`] (e.g. [`GenerateDeltaNotification`]). Defaults of the
//! contract are applied by serde when a field is absent; an unknown field or a field of
//! the wrong type is an error ([`InvalidParams`](crate::ErrorCode::InvalidParams)).

mod cache;
mod cancel;
mod common;
mod generate;
mod initialize;
mod load;
mod reset;
mod sampling;
mod shutdown;
mod status;
mod tokenize;
mod unload;

pub use cache::*;
pub use cancel::*;
pub use common::*;
pub use generate::*;
pub use initialize::*;
pub use load::*;
pub use reset::*;
pub use sampling::*;
pub use shutdown::*;
pub use status::*;
pub use tokenize::*;
pub use unload::*;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::error::ResponseError;

/// A request method: its name on the wire, its params and its result.
pub trait Method {
    /// The `method` string, e.g. `"generate"`.
    const NAME: &'static str;
    /// The `params` object.
    type Params: Serialize + DeserializeOwned + JsonSchema + std::fmt::Debug + Send + 'static;
    /// The `result` of a successful response.
    type Result: Serialize + DeserializeOwned + JsonSchema + std::fmt::Debug + Send + 'static;

    /// Checks what serde cannot (ranges, one-of rules); the error is
    /// [`InvalidParams`](crate::ErrorCode::InvalidParams) `{field, reason}`.
    fn validate(_params: &Self::Params) -> Result<(), ResponseError> {
        Ok(())
    }

    /// Decodes and validates `params` (absent params decode as `{}`).
    fn parse_params(params: &Value) -> Result<Self::Params, ResponseError> {
        let parsed = crate::params::parse_params(params)?;
        Self::validate(&parsed)?;
        Ok(parsed)
    }
}

/// A notification: its name on the wire and its params. It is never answered.
pub trait NotificationMethod {
    /// The `method` string, e.g. `"generate/delta"`.
    const NAME: &'static str;
    /// The `params` object.
    type Params: Serialize + DeserializeOwned + JsonSchema + std::fmt::Debug + Send + 'static;
}

/// The contract's methods, in the contract's order: the one list of them. Calls
/// `$callback! { Initialize, Load, ... }` with every method's type (as `$m:ty` fragments), so
/// that what lists the methods is generated from here: [`METHOD_NAMES`], the schema's `methods`
/// index ([`crate::schema`]) and the worker's dispatcher (which does not compile until it
/// handles every method listed here).
#[macro_export]
macro_rules! for_each_method {
    ($callback:ident) => {
        $callback! {
            $crate::methods::Initialize,
            $crate::methods::Load,
            $crate::methods::Generate,
            $crate::methods::Cancel,
            $crate::methods::Unload,
            $crate::methods::Reset,
            $crate::methods::Status,
            $crate::methods::Tokenize,
            $crate::methods::CacheList,
            $crate::methods::CachePin,
            $crate::methods::CacheFork,
            $crate::methods::CacheEvict,
            $crate::methods::Shutdown
        }
    };
}

macro_rules! method_names {
    ($($m:ty),*) => {
        /// Names of the methods, as on the wire, in the order of [`crate::for_each_method!`].
        pub const METHOD_NAMES: [&str; [$(<$m as Method>::NAME),*].len()] =
            [$(<$m as Method>::NAME),*];
    };
}
for_each_method!(method_names);

/// Declares a method's zero-sized type and its [`Method`] impl without a `validate` override.
macro_rules! method {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $params:ty, $result:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub enum $ty {}

        impl $crate::methods::Method for $ty {
            const NAME: &'static str = $name;
            type Params = $params;
            type Result = $result;
        }
    };
}

/// Declares a notification's zero-sized type and its [`NotificationMethod`] impl.
macro_rules! notification {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $params:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub enum $ty {}

        impl $crate::methods::NotificationMethod for $ty {
            const NAME: &'static str = $name;
            type Params = $params;
        }
    };
}

pub(crate) use method;
pub(crate) use notification;
