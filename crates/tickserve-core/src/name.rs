//! [`Name`]: a name every answer of a model carries (the model's, its
//! version's, an output's), shared rather than copied.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A name shared by the answers that carry it: a clone counts a reference
/// where a `String` would allocate and copy its bytes. It reads as a `str`
/// and compares with one.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Name(Arc<str>);

impl Name {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl From<&str> for Name {
    fn from(name: &str) -> Name {
        Name(Arc::from(name))
    }
}

impl From<String> for Name {
    fn from(name: String) -> Name {
        Name(Arc::from(name))
    }
}

impl From<&String> for Name {
    fn from(name: &String) -> Name {
        Name(Arc::from(name.as_str()))
    }
}

impl From<Name> for String {
    fn from(name: Name) -> String {
        name.0.to_string()
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        &*self.0 == other.as_str()
    }
}

impl PartialEq<Name> for str {
    fn eq(&self, other: &Name) -> bool {
        self == &*other.0
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        *self == &*other.0
    }
}

impl PartialEq<Name> for String {
    fn eq(&self, other: &Name) -> bool {
        self.as_str() == &*other.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_reads_and_compares_as_its_text() {
        let name = Name::from("alpha_mlp");
        let copy = name.clone();
        assert!(Arc::ptr_eq(&name.0, &copy.0), "a clone shares the text");
        assert_eq!(name, "alpha_mlp");
        assert_eq!("alpha_mlp", name);
        assert_eq!(name, "alpha_mlp".to_string());
        assert_ne!(name, "alpha");
        assert_eq!(format!("{name} {name:?}"), "alpha_mlp \"alpha_mlp\"");
        assert_eq!(String::from(name.clone()), "alpha_mlp");
        assert_eq!(name.len(), 9);
        assert_eq!(Name::default(), "");
    }
}
