//! One declaration per setting, for both services. A service lists its settings once in
//! [`settings!`](crate::settings!) — key, [`Kind`], default, help, and attributes such as
//! `#[env("GORGE_LISTEN_ADDR")]` — and everything else follows from that list: the
//! environment variable names, the file keys, parsing with errors that say in plain words
//! what is valid, unknown-key and unknown-variable suggestions, the `--check-config` lines,
//! the TOML of `--print-config`, and the docs table (checked by each service's tests).
//!
//! Layering is always built-in defaults → the configuration file → the environment, where an
//! empty variable means "use the default" (compose files pass `VAR=""`).

use std::fmt::Debug;
use std::path::Path;

use serde_json::{Map, Value};

use crate::config::{
    env_value, is_service_link, mask_url_password, refuse_service_link, unknown_key_reason,
    without_url_password, CheckLine, ConfigError, Secret, Source,
};

/// What a setting's text must be, in plain words, and how it parses and prints. The kind of a
/// setting decides all of it, so two settings of one kind can never disagree.
pub trait Kind {
    /// The parsed value.
    type Value: Clone + PartialEq + Debug;
    /// What is valid, for errors (`expected {VALID}`): "a port number 1-65535".
    const VALID: &'static str;
    /// Never printed: `--check-config` masks it, `--print-config` writes it empty.
    const SECRET: bool = false;
    /// What a valid value looks like to a check outside the binary (the Helm chart's, at
    /// template time); [`Shape::Free`] when only the binary can tell.
    const SHAPE: Shape = Shape::Free;
    /// From an environment variable; `None` when the text is not valid.
    fn parse(text: &str) -> Option<Self::Value>;
    /// As `--check-config` prints it (secrets masked).
    fn show(value: &Self::Value) -> String;
    /// From a file, where numbers must be numbers and text must be strings; `Err(reason)`.
    fn from_file(value: &Value) -> Result<Self::Value, String> {
        match value {
            Value::String(text) => {
                Self::parse(text).ok_or_else(|| format!("expected {}", Self::VALID))
            }
            _ => Err("expected a string".to_string()),
        }
    }
    /// As `--print-config` writes it into a file (secrets empty).
    fn to_file(value: &Self::Value) -> Value {
        Value::from(Self::show(value))
    }
    /// Text of this kind as an error about it shows it (a secret masked).
    fn mask(text: &str) -> String {
        match Self::SECRET {
            true => Secret::new(text).to_string(),
            false => text.to_string(),
        }
    }
}

/// What valid text of a kind looks like, for checks made without the binary (the chart's
/// settings catalog, [`chart_catalog`]). Whatever the shape, an empty value is the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Only the binary can tell (addresses, URLs, names, level lists).
    Free,
    /// A whole number from `.0` to `.1`.
    Range(u64, u64),
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// A log level list (`GORGE_LOG_LEVEL`): comma-separated parts, each a level word
    /// ([`crate::logging::LEVEL_WORDS`], any case) or `component=level` with a component of
    /// the service; only the first part may be a bare level.
    LogLevels,
}

/// The reason for a file value that is not valid for a kind whose values are numbers.
pub fn number_from_file(value: &Value, min: u64, max: u64, valid: &str) -> Result<u64, String> {
    match value {
        Value::Number(n) => n
            .as_u64()
            .filter(|n| (min..=max).contains(n))
            .ok_or_else(|| format!("expected {valid}")),
        Value::String(_) => Err(format!("expected {valid}: {NOT_A_STRING}")),
        _ => Err(format!("expected {valid}")),
    }
}

/// The suffix of an error about a quoted number in a file.
pub const NOT_A_STRING: &str = "a number, not a string";

/// Declares a [`Kind`] of whole numbers from `MIN` to `MAX` (both in the `VALID` text, which a
/// test checks against the bounds).
#[macro_export]
macro_rules! number_kind {
    ($(#[$meta:meta])* $name:ident: $ty:ty, $min:literal ..= $max:literal, $valid:literal) => {
        $(#[$meta])*
        #[derive(Debug)]
        pub struct $name;

        impl $crate::settings::Kind for $name {
            type Value = $ty;
            const VALID: &'static str = $valid;
            const SHAPE: $crate::settings::Shape = $crate::settings::Shape::Range($min, $max);
            fn parse(text: &str) -> Option<$ty> {
                text.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| ($min..=$max).contains(n))
                    .and_then(|n| <$ty>::try_from(n).ok())
            }
            fn from_file(value: &$crate::settings::Json) -> Result<$ty, String> {
                $crate::settings::number_from_file(value, $min, $max, $valid)
                    .and_then(|n| <$ty>::try_from(n).map_err(|_| format!("expected {}", $valid)))
            }
            fn show(value: &$ty) -> String {
                value.to_string()
            }
            fn to_file(value: &$ty) -> $crate::settings::Json {
                $crate::settings::Json::from(*value)
            }
        }
    };
}

/// A value of a file (JSON, or TOML read as JSON), for [`number_kind!`](crate::number_kind!).
pub type Json = Value;

number_kind!(
    /// A TCP port.
    Port: u16, 1..=65535, "a port number 1-65535"
);
number_kind!(
    /// A limit on how many of something; never 0.
    Count: u64, 1..=4294967296, "a whole number from 1 to 4294967296, e.g. 1024"
);
number_kind!(
    /// A limit where 0 turns the thing off.
    CountOrZero: u64, 0..=4294967296, "a whole number from 0 to 4294967296, e.g. 1000"
);
number_kind!(
    /// A size in bytes; at most 1 TiB so no derived size overflows.
    Bytes: u64, 1..=1099511627776, "a whole number of bytes from 1 to 1099511627776, e.g. 65536"
);
number_kind!(
    /// A duration in whole seconds, at most a day.
    Seconds: u64, 1..=86400, "a whole number of seconds from 1 to 86400, e.g. 30"
);
number_kind!(
    /// A duration in whole seconds where 0 means "none", at most a day.
    SecondsOrZero: u64, 0..=86400, "a whole number of seconds from 0 to 86400, e.g. 10"
);
number_kind!(
    /// A duration in milliseconds, at most a day.
    Millis: u64, 1..=86400000, "a whole number of milliseconds from 1 to 86400000, e.g. 250"
);

/// Free text, validated where it is used (addresses, URLs, names).
#[derive(Debug)]
pub struct Text;

impl Kind for Text {
    type Value = String;
    const VALID: &'static str = "text";
    fn parse(text: &str) -> Option<String> {
        Some(text.to_string())
    }
    fn show(value: &String) -> String {
        value.clone()
    }
}

/// A password or token: any text, never printed.
#[derive(Debug)]
pub struct SecretText;

impl Kind for SecretText {
    type Value = Secret;
    const VALID: &'static str = "text";
    const SECRET: bool = true;
    fn parse(text: &str) -> Option<Secret> {
        Some(Secret::new(text))
    }
    fn show(value: &Secret) -> String {
        value.to_string()
    }
    fn to_file(_: &Secret) -> Value {
        Value::from("")
    }
}

/// A URL that may hold a password (`redis://user:PASSWORD@host:6379/0`): the password is a
/// secret, the rest of the URL is not. `--check-config` and errors show the URL with only the
/// password masked; `--print-config` writes it without the password, so a URL that has none
/// prints and loads back exactly as it is.
#[derive(Debug)]
pub struct SecretUrl;

impl Kind for SecretUrl {
    type Value = Secret;
    const VALID: &'static str = "text";
    fn parse(text: &str) -> Option<Secret> {
        Some(Secret::new(text))
    }
    fn show(value: &Secret) -> String {
        mask_url_password(value.expose())
    }
    fn to_file(value: &Secret) -> Value {
        Value::from(without_url_password(value.expose()))
    }
    fn mask(text: &str) -> String {
        mask_url_password(text)
    }
}

/// A setting that may be absent (no default value).
#[derive(Debug)]
pub struct Optional<K>(std::marker::PhantomData<K>);

/// How an absent [`Optional`] setting prints.
pub const UNSET: &str = "(unset)";

impl<K: Kind> Kind for Optional<K> {
    type Value = Option<K::Value>;
    const VALID: &'static str = K::VALID;
    const SECRET: bool = K::SECRET;
    const SHAPE: Shape = K::SHAPE;
    fn parse(text: &str) -> Option<Self::Value> {
        K::parse(text).map(Some)
    }
    fn from_file(value: &Value) -> Result<Self::Value, String> {
        match value {
            Value::Null => Ok(None),
            other => K::from_file(other).map(Some),
        }
    }
    fn show(value: &Self::Value) -> String {
        value.as_ref().map_or_else(|| UNSET.to_string(), K::show)
    }
    fn to_file(value: &Self::Value) -> Value {
        value.as_ref().map_or(Value::Null, K::to_file)
    }
    fn mask(text: &str) -> String {
        K::mask(text)
    }
}

/// Static facts about one setting, from its line in [`settings!`](crate::settings!). The
/// attributes of that line are the `const fn` builders below (`#[env_only]` is
/// [`SettingInfo::env_only`]), so adding an attribute is adding a builder.
#[derive(Debug, Clone, Copy)]
pub struct SettingInfo {
    /// The key: lower case, as in the file; the variable is the prefix + the key in upper case.
    pub key: &'static str,
    /// What it does, as the docs table says it.
    pub help: &'static str,
    /// Never printed.
    pub secret: bool,
    /// Only from the environment, not a file key.
    pub env_only: bool,
    /// What is valid, in words (the kind's [`Kind::VALID`]).
    pub valid: &'static str,
    /// What is valid, for checks outside the binary (the kind's [`Kind::SHAPE`]).
    pub shape: Shape,
    env: Option<&'static str>,
    doc_default: Option<&'static str>,
    mask: fn(&str) -> String,
}

impl SettingInfo {
    /// A setting named `key` of kind `K`.
    pub const fn new<K: Kind>(key: &'static str, help: &'static str) -> Self {
        SettingInfo {
            key,
            help,
            secret: K::SECRET,
            valid: K::VALID,
            shape: K::SHAPE,
            env_only: false,
            env: None,
            doc_default: None,
            mask: K::mask,
        }
    }

    /// `#[env_only]`: read only from the environment (the file cannot name itself).
    pub const fn env_only(self) -> Self {
        SettingInfo {
            env_only: true,
            ..self
        }
    }

    /// `#[env("NAME")]`: the variable is `NAME`, not the prefix + key (a variable both
    /// services share). The prefixed name is then refused rather than silently ignored.
    pub const fn env(self, name: &'static str) -> Self {
        SettingInfo {
            env: Some(name),
            ..self
        }
    }

    /// `#[doc_default("…")]`: what the docs table says about a default that is not a plain
    /// value (an absent setting whose effect has a default, a long list).
    pub const fn doc_default(self, text: &'static str) -> Self {
        SettingInfo {
            doc_default: Some(text),
            ..self
        }
    }

    /// The environment variable, given the service's prefix.
    pub fn env_var(&self, prefix: &str) -> String {
        self.env
            .map_or_else(|| self.prefixed_var(prefix), str::to_string)
    }

    /// The variable when `#[env]` names one other than the prefix + the key in upper case.
    pub fn own_env_var(&self) -> Option<&'static str> {
        self.env
    }

    /// Text given for this setting as an error shows it (its kind's [`Kind::mask`]).
    pub fn masked(&self, text: &str) -> String {
        (self.mask)(text)
    }

    /// The prefix + the key in upper case, which is the variable unless `#[env]` says otherwise.
    fn prefixed_var(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.key.to_uppercase())
    }
}

/// What [`settings!`](crate::settings!) implements for the struct it declares.
pub trait Declared: Default + Clone + Debug {
    /// Prefix of the variables (`GORGE_WEBHOOK_`).
    const PREFIX: &'static str;
    /// Every setting, in the order `--check-config`, `--print-config` and the docs show them.
    const SETTINGS: &'static [SettingInfo];
    /// Sets `key` from text; `Err(valid)` when the text is not valid for it.
    fn set_text(&mut self, key: &str, text: &str) -> Result<(), &'static str>;
    /// Sets `key` from a file value; `Err(reason)`.
    fn set_file(&mut self, key: &str, value: &Value) -> Result<(), String>;
    /// Every value as `--check-config` prints it, in [`Declared::SETTINGS`] order.
    fn shown(&self) -> Vec<String>;
    /// Every value as a file holds it, in [`Declared::SETTINGS`] order.
    fn file_values(&self) -> Vec<Value>;

    /// The setting `key`, if it is one.
    fn info(key: &str) -> Option<&'static SettingInfo> {
        Self::SETTINGS.iter().find(|s| s.key == key)
    }

    /// The keys a file may hold.
    fn file_keys() -> impl Iterator<Item = &'static str> {
        Self::SETTINGS.iter().filter(|s| !s.env_only).map(|s| s.key)
    }

    /// The environment variable of `key` (which must be a setting).
    fn env_var(key: &str) -> String {
        Self::info(key).map_or_else(
            || format!("{}{}", Self::PREFIX, key.to_uppercase()),
            |info| info.env_var(Self::PREFIX),
        )
    }
}

/// Declares a service's settings: a struct with one field per setting (its kind's value),
/// its [`Default`], and [`Declared`]. One line per setting:
///
/// ```
/// use gorge_service::settings::{Millis, Text};
/// gorge_service::settings! {
///     /// The example's settings.
///     pub struct Example, prefix "GORGE_EXAMPLE_", keys ExampleKeys {
///         poll_interval_ms: Millis = 1000, "idle poll period";
///         #[env("GORGE_LISTEN_ADDR")]
///         listen_addr: Text = "0.0.0.0:8160".into(), "status listener";
///     }
/// }
/// assert_eq!(Example::KEYS.poll_interval_ms, "poll_interval_ms");
/// ```
///
/// With `keys NAME`, it also declares `NAME`, a struct of every key as a field, and
/// `Example::KEYS`: code that names a setting (in an error, a `--check-config` line) writes
/// `Example::KEYS.listen_addr` rather than the text, so a misspelt or renamed key does not
/// compile.
#[macro_export]
macro_rules! settings {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident, prefix $prefix:literal, keys $keys:ident {
            $(
                $(#[$attr:ident $( ( $($arg:expr),* ) )?])*
                $field:ident : $kind:ty = $default:expr, $help:literal;
            )*
        }
    ) => {
        $crate::settings! {
            $(#[$meta])*
            $vis struct $name, prefix $prefix {
                $(
                    $(#[$attr $( ( $($arg),* ) )?])*
                    $field : $kind = $default, $help;
                )*
            }
        }

        #[doc = concat!("The key of every setting of [`", stringify!($name), "`], as a field.")]
        #[derive(Debug, Clone, Copy)]
        // Code names only the keys it refers to.
        #[allow(dead_code)]
        $vis struct $keys {
            $( #[doc = $help] pub $field: &'static str, )*
        }

        impl $name {
            /// The key of every setting (`KEYS.x` is `"x"`).
            pub const KEYS: $keys = $keys { $( $field: stringify!($field), )* };
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident, prefix $prefix:literal {
            $(
                $(#[$attr:ident $( ( $($arg:expr),* ) )?])*
                $field:ident : $kind:ty = $default:expr, $help:literal;
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        $vis struct $name {
            $( #[doc = $help] pub $field: <$kind as $crate::settings::Kind>::Value, )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name { $( $field: $default, )* }
            }
        }

        impl $crate::settings::Declared for $name {
            const PREFIX: &'static str = $prefix;
            const SETTINGS: &'static [$crate::settings::SettingInfo] = &[
                $( $crate::settings::SettingInfo::new::<$kind>(
                    stringify!($field),
                    $help,
                ) $( .$attr( $($($arg),*)? ) )* , )*
            ];

            fn set_text(&mut self, key: &str, text: &str) -> Result<(), &'static str> {
                use $crate::settings::Kind as _;
                match key {
                    $( stringify!($field) => {
                        self.$field = <$kind>::parse(text).ok_or(<$kind>::VALID)?;
                    } )*
                    _ => {}
                }
                Ok(())
            }

            fn set_file(&mut self, key: &str, value: &$crate::settings::Json) -> Result<(), String> {
                use $crate::settings::Kind as _;
                match key {
                    $( stringify!($field) => self.$field = <$kind>::from_file(value)?, )*
                    _ => {}
                }
                Ok(())
            }

            fn shown(&self) -> Vec<String> {
                use $crate::settings::Kind as _;
                vec![ $( <$kind>::show(&self.$field), )* ]
            }

            fn file_values(&self) -> Vec<$crate::settings::Json> {
                use $crate::settings::Kind as _;
                vec![ $( <$kind>::to_file(&self.$field), )* ]
            }
        }
    };
}

/// Settings as layered — defaults, then a file, then the environment — and where each value
/// came from.
#[derive(Debug, Clone)]
pub struct Layered<S> {
    /// The values.
    pub values: S,
    sources: Vec<Source>,
}

impl<S: Declared> Default for Layered<S> {
    fn default() -> Self {
        Layered {
            values: S::default(),
            sources: vec![Source::Default; S::SETTINGS.len()],
        }
    }
}

impl<S: Declared> Layered<S> {
    /// Defaults, then the environment of this process.
    pub fn from_env() -> Result<Layered<S>, ConfigError> {
        let mut layered = Layered::default();
        layered.apply_env(&|var| env_value(var), &[])?;
        Ok(layered)
    }

    fn index(key: &str) -> Option<usize> {
        S::SETTINGS.iter().position(|s| s.key == key)
    }

    /// Where the value of `key` came from.
    pub fn source(&self, key: &str) -> Source {
        Self::index(key).map_or(Source::Default, |i| self.sources[i].clone())
    }

    /// Records that `key` came from `source` (e.g. a command-line option).
    pub fn set_source(&mut self, key: &str, source: Source) {
        if let Some(i) = Self::index(key) {
            self.sources[i] = source;
        }
    }

    /// Applies the top-level entries of the file at `path`: each entry whose key is a file
    /// key sets that setting (an invalid value is an error naming `key (in PATH)`); the other
    /// entries are returned in file order, for the service to refuse or interpret.
    pub fn apply_file(
        &mut self,
        path: &Path,
        entries: &Map<String, Value>,
    ) -> Result<Vec<(String, Value)>, ConfigError> {
        let mut rest = Vec::new();
        for (key, value) in entries {
            match S::info(key).filter(|info| !info.env_only) {
                Some(info) => {
                    self.values.set_file(info.key, value).map_err(|reason| {
                        ConfigError::new(in_file(key, path), value_text(value), reason)
                    })?;
                    self.set_source(info.key, Source::File(path.display().to_string()));
                }
                None => rest.push((key.clone(), value.clone())),
            }
        }
        Ok(rest)
    }

    /// Applies the environment as `env` reads it (unset and empty are the same), skipping the
    /// settings in `skip`. A Kubernetes service link where a setting belongs, or a setting's
    /// variable under its prefixed name when it has a shared one, is refused.
    pub fn apply_env(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        skip: &[&str],
    ) -> Result<(), ConfigError> {
        for (i, info) in S::SETTINGS.iter().enumerate() {
            let (var, prefixed) = (info.env_var(S::PREFIX), info.prefixed_var(S::PREFIX));
            let shown = |text: &str| info.masked(text);
            if skip.contains(&info.key) {
                continue;
            }
            if let Some(text) = env(&prefixed).filter(|_| prefixed != var) {
                let reason = format!("not read: this setting's variable is {var}");
                return Err(ConfigError::new(prefixed, shown(&text), reason));
            }
            let Some(text) = env(&var) else { continue };
            refuse_service_link(&var, &text)?;
            self.values.set_text(info.key, &text).map_err(|valid| {
                ConfigError::new(&var, shown(&text), format!("expected {valid}"))
            })?;
            self.sources[i] = Source::Env(var);
        }
        Ok(())
    }

    /// One `--check-config` line per setting: its variable, its value (or what `annotate`
    /// says about it, for values that need context) and its source.
    pub fn check_lines(&self, annotate: impl Fn(&str) -> Option<String>) -> Vec<CheckLine> {
        S::SETTINGS
            .iter()
            .zip(self.values.shown())
            .zip(&self.sources)
            .map(|((info, shown), source)| CheckLine {
                name: info.env_var(S::PREFIX),
                value: annotate(info.key).unwrap_or(shown),
                source: source.clone(),
            })
            .collect()
    }

    /// `key` as the operator wrote it, for an error about its value: `key (in PATH)` when the
    /// file set it, the option or variable that set it, else its variable. An operator who
    /// wrote `peer_dns` in a file looks for that, not for the variable's name.
    pub fn name(&self, key: &str) -> String {
        match self.source(key) {
            Source::File(path) => in_file(key, Path::new(&path)),
            Source::Env(name) | Source::Option(name) => name,
            Source::Default | Source::Derived(_) => S::env_var(key),
        }
    }

    /// Whether the operator set `key` (in the file, the environment or an option).
    pub fn is_set(&self, key: &str) -> bool {
        self.source(key) != Source::Default
    }

    /// Of two settings that a rule between them refuses, the one an error names: `other` when
    /// the operator set it and not `preferred`, else `preferred`. An operator who changed one
    /// of them hears about that one, not about a default they never wrote.
    pub fn blame<'k>(&self, preferred: &'k str, other: &'k str) -> &'k str {
        match (self.is_set(preferred), self.is_set(other)) {
            (false, true) => other,
            _ => preferred,
        }
    }

    /// The error refusing the value of `key`: named as the operator wrote it
    /// ([`Layered::name`]), its value as `--check-config` shows it (secrets masked).
    pub fn refuse(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        let shown = Self::index(key)
            .map(|i| self.values.shown().swap_remove(i))
            .unwrap_or_default();
        ConfigError::new(self.name(key), shown, reason)
    }
}

fn in_file(key: &str, path: &Path) -> String {
    format!("{key} (in {})", path.display())
}

/// A file value as an error shows it: text as is, anything else as JSON.
pub fn value_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Warnings for variables of `vars` that start with `S::PREFIX` but are no setting, with a
/// did-you-mean; Kubernetes service-link variables are skipped (the environment is shared).
pub fn unknown_env_warnings<S: Declared>(
    vars: impl IntoIterator<Item = (String, String)>,
) -> Vec<String> {
    let known: Vec<String> = S::SETTINGS.iter().map(|s| s.env_var(S::PREFIX)).collect();
    let prefixed: Vec<String> = S::SETTINGS
        .iter()
        .map(|s| s.prefixed_var(S::PREFIX))
        .collect();
    let mut vars: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(var, value)| {
            var.starts_with(S::PREFIX)
                && !known.contains(var)
                && !prefixed.contains(var)
                && !is_service_link(var, value)
        })
        .collect();
    vars.sort();
    vars.into_iter()
        .map(
            |(var, _)| match crate::config::did_you_mean(&var, known.iter().map(String::as_str)) {
                Some(near) => format!("{var} is not a setting (did you mean {near}?); ignored"),
                None => format!("{var} is not a setting; ignored"),
            },
        )
        .collect()
}

/// The error for a file entry that is not a setting: `key (in PATH)`, with a did-you-mean
/// among `known`.
pub fn unknown_file_key<'a>(
    path: &Path,
    key: &str,
    value: &Value,
    known: impl IntoIterator<Item = &'a str>,
) -> ConfigError {
    ConfigError::new(
        in_file(key, path),
        value_text(value),
        unknown_key_reason(key, known),
    )
}

/// A configuration file format, chosen by the file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// `.json`
    Json,
    /// `.toml`, read with figment's TOML provider.
    Toml,
}

impl FileFormat {
    fn extension(self) -> &'static str {
        match self {
            FileFormat::Json => "json",
            FileFormat::Toml => "toml",
        }
    }

    fn name(self) -> &'static str {
        match self {
            FileFormat::Json => "JSON",
            FileFormat::Toml => "TOML",
        }
    }
}

/// Reads the configuration file at `path` — named by the option or variable `named_by`, which
/// every error about the file itself names — as one of `formats`, into its top-level entries.
/// The only place a parser's message is reworded: reduced to one line.
pub fn read_file(
    path: &Path,
    named_by: &str,
    formats: &[FileFormat],
) -> Result<Map<String, Value>, ConfigError> {
    let shown = path.display().to_string();
    let bad = |reason: String| ConfigError::new(named_by, &shown, reason);
    let extension = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    let list = |part: fn(FileFormat) -> String| {
        formats
            .iter()
            .map(|f| part(*f))
            .collect::<Vec<_>>()
            .join(" or ")
    };
    let Some(format) = formats
        .iter()
        .find(|f| extension.as_deref() == Some(f.extension()))
    else {
        return Err(bad(format!(
            "the file must be {} with a {} extension",
            list(|f| f.name().to_string()),
            list(|f| format!(".{}", f.extension()))
        )));
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read the file: {e}")))?;
    let value = match format {
        FileFormat::Json => {
            serde_json::from_str::<Value>(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?
        }
        FileFormat::Toml => {
            use figment::providers::Format;
            use figment::Provider;
            let data = figment::providers::Toml::string(&text)
                .data()
                .map_err(|e| bad(one_line(&e.to_string())))?;
            let dict = data.into_values().next().unwrap_or_default();
            serde_json::to_value(dict).map_err(|e| bad(one_line(&e.to_string())))?
        }
    };
    match value {
        Value::Object(entries) => Ok(entries),
        _ => Err(bad(format!(
            "the file must hold a {} object",
            format.name()
        ))),
    }
}

/// A parser message on one line: source excerpts (`  |` lines) dropped, the rest joined.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.contains('|'))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A TOML file holding every file key of `values` (secrets written empty, with a comment),
/// after `header` (comment lines); it loads back unchanged.
pub fn toml_file<S: Declared>(header: &str, values: &S) -> String {
    let mut out = header.to_string();
    for (info, value) in S::SETTINGS.iter().zip(values.file_values()) {
        if info.env_only {
            continue;
        }
        let key = info.key;
        if info.secret {
            out.push_str(&format!(
                "# {key}: a secret; set it here or in the environment\n"
            ));
        }
        match value {
            Value::Null => out.push_str(&format!("# {key} is unset\n")),
            // TOML basic strings share JSON's escapes, and TOML integers are JSON's.
            value => out.push_str(&format!("{key} = {value}\n")),
        }
    }
    out
}

/// The rows of `S` in a docs table (`| Variable | Default | Meaning |`), one per setting.
pub fn docs_rows<S: Declared>() -> Vec<Vec<String>> {
    let defaults = S::default().shown();
    S::SETTINGS
        .iter()
        .zip(defaults)
        .map(|(info, default)| {
            let default = match (info.doc_default, default.as_str()) {
                (Some(text), _) => text.to_string(),
                (None, UNSET) => "—".to_string(),
                (None, "" | "(empty)") => "empty".to_string(),
                (None, value) => format!("`{value}`"),
            };
            vec![
                format!("`{}`", info.env_var(S::PREFIX)),
                default,
                info.help.to_string(),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    settings! {
        struct Demo, prefix "DEMO_" {
            port: Port = 80, "a port";
            name: Text = "x".into(), "a name";
            pass: SecretText = Secret::default(), "a secret";
            #[env("SHARED_ADDR")]
            addr: Text = "0.0.0.0:1".into(), "an address";
            #[env_only]
            file: Optional<Text> = None, "a file";
        }
    }

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |var| {
            vars.iter()
                .find(|(k, v)| *k == var && !v.is_empty())
                .map(|(_, v)| v.to_string())
        }
    }

    fn layered(
        vars: &'static [(&'static str, &'static str)],
    ) -> Result<Layered<Demo>, ConfigError> {
        let mut layered = Layered::<Demo>::default();
        layered.apply_env(&env(vars), &[])?;
        Ok(layered)
    }

    #[test]
    fn env_names_sources_and_plain_word_errors() {
        let l = layered(&[
            ("DEMO_PORT", "8080"),
            ("DEMO_NAME", ""),
            ("SHARED_ADDR", "1.2.3.4:5"),
        ])
        .unwrap();
        assert_eq!((l.values.port, l.values.name.as_str()), (8080, "x"));
        assert_eq!(l.source("port"), Source::Env("DEMO_PORT".into()));
        assert_eq!(l.source("name"), Source::Default);
        assert_eq!(l.source("addr"), Source::Env("SHARED_ADDR".into()));
        let err = layered(&[("DEMO_PORT", "0")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: DEMO_PORT=\"0\": expected a port number 1-65535"
        );
        let err = layered(&[("DEMO_PORT", "tcp://10.0.0.1:80")]).unwrap_err();
        assert!(err.reason.contains("service link"), "{err}");
        let err = layered(&[("DEMO_ADDR", "1.2.3.4:5")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: DEMO_ADDR=\"1.2.3.4:5\": not read: this setting's variable is SHARED_ADDR"
        );
        let l = layered(&[("DEMO_PASS", "hunter2")]).unwrap();
        assert_eq!(l.values.pass.expose(), "hunter2");
        let lines = l.check_lines(|key| (key == "name").then(|| "x (annotated)".to_string()));
        let shown: Vec<String> = lines
            .iter()
            .map(|l| format!("{} = {} # {}", l.name, l.value, l.source))
            .collect();
        assert_eq!(
            shown,
            [
                "DEMO_PORT = 80 # default",
                "DEMO_NAME = x (annotated) # default",
                "DEMO_PASS = ******** # env DEMO_PASS",
                "SHARED_ADDR = 0.0.0.0:1 # default",
                "DEMO_FILE = (unset) # default",
            ]
        );
    }

    #[test]
    fn file_entries_set_known_keys_and_return_the_rest() {
        let mut l = Layered::<Demo>::default();
        let entries: Map<String, Value> =
            serde_json::from_str(r#"{"port": 81, "servers": [], "file": "x"}"#).unwrap();
        let rest = l.apply_file(Path::new("/etc/demo.json"), &entries).unwrap();
        assert_eq!(l.values.port, 81);
        assert_eq!(l.source("port"), Source::File("/etc/demo.json".into()));
        let keys: Vec<&str> = rest.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["servers", "file"],
            "an env-only key is not a file key"
        );
        let entries: Map<String, Value> = serde_json::from_str(r#"{"port": "81"}"#).unwrap();
        let err = l
            .apply_file(Path::new("/etc/demo.json"), &entries)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: port (in /etc/demo.json)=\"81\": expected a port number 1-65535: a number, not a string"
        );
    }

    #[test]
    fn unknown_variables_get_a_suggestion_but_service_links_do_not() {
        let vars = [
            ("DEMO_PROT", "1"),
            ("DEMO_PORT", "1"),
            ("DEMO_SERVICE_HOST", "10.0.0.1"),
            ("OTHER", "1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(
            unknown_env_warnings::<Demo>(vars),
            ["DEMO_PROT is not a setting (did you mean DEMO_PORT?); ignored"]
        );
    }

    number_kind!(
        /// A service's own number kind.
        Tenths: u8, 0..=10, "a whole number from 0 to 10, e.g. 5"
    );

    settings! {
        /// One setting of every kind, all but one (`optional_unset`) away from its default.
        struct AllKinds, prefix "ALL_", keys AllKindsKeys {
            port: Port = 1, "port";
            count: Count = 1, "count";
            count_or_zero: CountOrZero = 1, "count_or_zero";
            bytes: Bytes = 1, "bytes";
            seconds: Seconds = 1, "seconds";
            seconds_or_zero: SecondsOrZero = 1, "seconds_or_zero";
            millis: Millis = 1, "millis";
            tenths: Tenths = 1, "tenths";
            text: Text = String::new(), "text";
            secret: SecretText = Secret::default(), "secret";
            url: SecretUrl = Secret::default(), "url";
            password_url: SecretUrl = Secret::default(), "password_url";
            optional: Optional<Port> = None, "optional";
            optional_unset: Optional<Text> = None, "optional_unset";
            optional_url: Optional<SecretUrl> = None, "optional_url";
        }
    }

    /// What `--print-config` writes loads back as the same values; only secrets are not
    /// written (a password of a URL, a secret's text) and load back as their defaults.
    #[test]
    fn every_kind_round_trips_through_the_printed_file() {
        let values = AllKinds {
            port: 65535,
            count: 4294967296,
            count_or_zero: 0,
            bytes: 1099511627776,
            seconds: 86400,
            seconds_or_zero: 0,
            millis: 86400000,
            tenths: 10,
            text: "a \"quoted\" \\ text\nwith a newline, é and \u{1}".into(),
            secret: Secret::new("hunter2"),
            url: Secret::new("redis://redis:6379/0"),
            password_url: Secret::new("rediss://user:hunter2@redis:6380/2"),
            optional: Some(8080),
            optional_unset: None,
            optional_url: Some(Secret::new("redis://:hunter2@redis")),
        };
        let text = toml_file("# all kinds\n", &values);
        assert!(!text.contains("hunter2"), "{text}");
        let dir = tempfile_dir();
        let path = dir.join("all-kinds.toml");
        std::fs::write(&path, &text).unwrap();
        let entries = read_file(&path, "--config", &[FileFormat::Toml]).unwrap();
        let mut loaded = Layered::<AllKinds>::default();
        let rest = loaded.apply_file(&path, &entries).unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        let expected = AllKinds {
            secret: Secret::default(),
            password_url: Secret::new("rediss://user@redis:6380/2"),
            optional_url: Some(Secret::new("redis://redis")),
            ..values.clone()
        };
        assert_eq!(loaded.values, expected, "{text}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_setting_is_named_as_the_operator_wrote_it() {
        let keys = AllKinds::KEYS;
        assert_eq!((keys.port, keys.optional_url), ("port", "optional_url"));
        let mut l = Layered::<AllKinds>::default();
        let entries: Map<String, Value> =
            serde_json::from_str(r#"{"count": 5, "url": "redis://u:pw@h"}"#).unwrap();
        l.apply_file(Path::new("/etc/all.json"), &entries).unwrap();
        l.apply_env(&env(&[("ALL_SECONDS", "7")]), &[]).unwrap();
        assert_eq!(l.name(keys.count), "count (in /etc/all.json)");
        assert_eq!(l.name(keys.seconds), "ALL_SECONDS");
        assert_eq!(l.name(keys.millis), "ALL_MILLIS");
        assert_eq!(
            l.refuse(keys.url, "is no good").to_string(),
            "invalid configuration: url (in /etc/all.json)=\"redis://u:********@h\": is no good"
        );
        // Of a pair, the one the operator set.
        assert_eq!(l.blame(keys.millis, keys.seconds), keys.seconds);
        assert_eq!(l.blame(keys.seconds, keys.count), keys.seconds);
        assert_eq!(l.blame(keys.millis, keys.port), keys.millis);
    }

    #[test]
    fn print_docs_and_files() {
        let values = Demo {
            pass: Secret::new("hunter2"),
            ..Demo::default()
        };
        assert_eq!(
            toml_file("# demo\n", &values),
            "# demo\nport = 80\nname = \"x\"\n# pass: a secret; set it here or in the environment\npass = \"\"\naddr = \"0.0.0.0:1\"\n"
        );
        let rows = docs_rows::<Demo>();
        assert_eq!(rows[0], ["`DEMO_PORT`", "`80`", "a port"]);
        assert_eq!(rows[2][1], "empty");
        assert_eq!(rows[4][1], "—");
    }

    #[test]
    fn files_are_read_by_extension_and_errors_are_one_line() {
        let dir = tempfile_dir();
        let toml = dir.join("a.toml");
        std::fs::write(&toml, "port = 3\n[nested]\nx = 1\n").unwrap();
        let entries = read_file(&toml, "--config", &[FileFormat::Toml, FileFormat::Json]).unwrap();
        assert_eq!(
            Value::Object(entries),
            serde_json::json!({"nested": {"x": 1}, "port": 3})
        );
        std::fs::write(&toml, "port = = 3\n").unwrap();
        let err = read_file(&toml, "--config", &[FileFormat::Toml]).unwrap_err();
        assert!(
            err.reason.starts_with("TOML parse error at line 1"),
            "{err}"
        );
        assert!(!err.to_string().contains('\n'));
        let err = read_file(
            &dir.join("a.yaml"),
            "X_FILE",
            &[FileFormat::Toml, FileFormat::Json],
        )
        .unwrap_err();
        assert_eq!(err.key, "X_FILE");
        assert_eq!(
            err.reason,
            "the file must be TOML or JSON with a .toml or .json extension"
        );
        let err =
            read_file(&dir.join("missing.json"), "--config", &[FileFormat::Json]).unwrap_err();
        assert!(err.reason.starts_with("cannot read the file: "), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("gorge-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The bounds a number kind's text names are the bounds it accepts.
    fn bounds_match_the_text<K: Kind>() {
        let numbers: Vec<u64> = K::VALID
            .split(|c: char| !c.is_ascii_digit())
            .filter(|part| !part.is_empty())
            .map(|part| part.parse().unwrap())
            .collect();
        let (min, max) = (numbers[0], numbers[1]);
        assert!(K::parse(&min.to_string()).is_some(), "{}", K::VALID);
        assert!(K::parse(&max.to_string()).is_some(), "{}", K::VALID);
        assert!(K::parse(&(max + 1).to_string()).is_none(), "{}", K::VALID);
        if min > 0 {
            assert!(K::parse(&(min - 1).to_string()).is_none(), "{}", K::VALID);
        }
    }

    #[test]
    fn number_kinds_accept_exactly_the_range_they_name() {
        bounds_match_the_text::<Port>();
        bounds_match_the_text::<Count>();
        bounds_match_the_text::<CountOrZero>();
        bounds_match_the_text::<Bytes>();
        bounds_match_the_text::<Seconds>();
        bounds_match_the_text::<SecondsOrZero>();
        bounds_match_the_text::<Millis>();
        assert_eq!(SecondsOrZero::parse("18446744073709551616"), None);
    }
}
