//! A vision-language model's image fields (the `vision` feature): images per sample, their
//! size, what trains of the vision side; their URL keys `img`, `isz`, `vt`, `vp`.

use super::{parse_count, Field, PageState, Section};
use crate::number::{parse_whole_count, FieldError};

/// Images per sample on a first visit (vision-language models): none, a text-only batch
/// (the vision tower and its projector are on the GPU all the same); the fields are there
/// to add images.
pub const DEFAULT_IMAGES: &str = "0";
/// Image size on a first visit (vision-language models), width x height in pixels.
pub const DEFAULT_IMAGE_SIZE: &str = "1024x768";

/// A vision-language model's images and what trains of its vision side (the inputs of no
/// other model).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisionSettings {
    /// Images per sample, as typed (0: text only).
    pub images: String,
    /// Each image's width x height in pixels, as typed (`1024x768`).
    pub image_size: String,
    /// The vision tower trained (frozen by default, as most fine-tunes leave it).
    pub tower_trained: bool,
    /// The projector trained (by default, as most fine-tunes do).
    pub projector_trained: bool,
}

impl Default for VisionSettings {
    fn default() -> Self {
        Self {
            images: DEFAULT_IMAGES.to_owned(),
            image_size: DEFAULT_IMAGE_SIZE.to_owned(),
            tower_trained: false,
            projector_trained: true,
        }
    }
}

impl Section for VisionSettings {
    const KEYS: &'static [(Field, &'static str)] = &[
        (Field::Images, "img"),
        (Field::ImageSize, "isz"),
        (Field::VisionTower, "vt"),
        (Field::Projector, "vp"),
    ];
}

impl VisionSettings {
    /// Whether `field` travels in links: the image fields only when changed, so that every
    /// other link stays as it was (every other field travels).
    pub(super) fn travels(&self, field: Field) -> bool {
        match field {
            Field::Images => self.images != DEFAULT_IMAGES,
            Field::ImageSize => self.image_size != DEFAULT_IMAGE_SIZE,
            Field::VisionTower => self.tower_trained,
            Field::Projector => !self.projector_trained,
            _ => true,
        }
    }
}

/// A trained or frozen part of a vision-language model.
pub(super) const fn trained_key(trained: bool) -> &'static str {
    if trained {
        "trained"
    } else {
        "frozen"
    }
}

/// The keys of the vision tower's switch, its default (frozen) first.
pub(super) const TOWER_KEYS: [&str; 2] = [trained_key(false), trained_key(true)];
/// The keys of the projector's switch, its default (trained) first.
pub(super) const PROJECTOR_KEYS: [&str; 2] = [trained_key(true), trained_key(false)];

/// Parses an image size, `WIDTHxHEIGHT` in pixels (`x`, `X`, `*` or the multiplication
/// sign between them; one number is a square).
///
/// # Errors
/// The message for the field.
pub fn parse_image_size(text: &str) -> Result<(u64, u64), FieldError> {
    let max = crate::MAX_IMAGE_SIDE;
    let text = text.trim();
    let side = |t: &str| parse_whole_count(t.trim(), 1, max, "pixels");
    match text.split_once(['x', 'X', '\u{d7}', '*']) {
        Some((w, h)) => Ok((side(w)?, side(h)?)),
        None if text.is_empty() => Err(FieldError::Empty),
        None => {
            let s = side(text)?;
            Ok((s, s))
        }
    }
}

impl PageState {
    /// The images of a vision-language model's step, none for a text-only batch (`None`
    /// for any other model: the image fields are not its inputs).
    ///
    /// # Errors
    /// The fields and their messages.
    pub fn parsed_vision(
        &self,
        arch: &crate::Architecture,
    ) -> Result<Option<crate::VisionInputs>, Vec<(Field, FieldError)>> {
        if !arch.is_vision_language() {
            return Ok(None);
        }
        let v = &self.vision;
        let mut errors = Vec::new();
        let images = parse_count(&v.images, crate::MAX_IMAGES, "images", true)
            .map_err(|e| errors.push((Field::Images, e)));
        let size = parse_image_size(&v.image_size).map_err(|e| errors.push((Field::ImageSize, e)));
        let (Ok(images), Ok((width, height))) = (images, size) else {
            return Err(errors);
        };
        Ok(Some(crate::VisionInputs {
            images,
            width,
            height,
            tower_trained: v.tower_trained,
            projector_trained: v.projector_trained,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_sizes_read_as_width_by_height() {
        assert_eq!(parse_image_size("1344x896"), Ok((1344, 896)));
        assert_eq!(parse_image_size(" 1024 X 768 "), Ok((1024, 768)));
        assert_eq!(parse_image_size("640\u{d7}480"), Ok((640, 480)));
        assert_eq!(parse_image_size("448"), Ok((448, 448)));
        assert_eq!(parse_image_size(""), Err(FieldError::Empty));
        assert!(parse_image_size("0x10").is_err());
        assert!(parse_image_size("10x").is_err());
        assert!(parse_image_size("1e9x10").is_err());
        assert!(parse_image_size("12.5x10").is_err());
    }
}
