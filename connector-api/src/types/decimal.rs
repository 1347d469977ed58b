//! Decimal numbers as exact text, shared by every decoder and sink that reads or writes decimals as digits.

use arrow_buffer::i256;

/// A decimal's exact text: `unscaled` × 10^-`scale` (`-12.3400`); a negative scale multiplies.
pub fn text(unscaled: i256, scale: i8) -> String {
    let digits = unscaled.to_string();
    let (sign, digits) = match digits.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", digits.as_str()),
    };
    if scale <= 0 {
        let zeros = "0".repeat(usize::from(scale.unsigned_abs()));
        return match digits {
            "0" => "0".to_string(),
            _ => format!("{sign}{digits}{zeros}"),
        };
    }
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

/// A decimal's text (`-12.3400`, `+1.5E+3`, `.5`) as its sign, its digits without leading zeros, and its scale;
/// `None` for anything else (`NaN`, `1,5`, `0x10`).
pub fn parse(text: &str) -> Option<(bool, String, u32)> {
    let text = text.trim();
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], rest[at + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let mut digits = format!("{int}{frac}");
    let mut scale = frac.len() as i64 - exponent;
    if scale < 0 {
        digits.push_str(&"0".repeat(usize::try_from(-scale).ok()?));
        scale = 0;
    }
    let digits = digits.trim_start_matches('0').to_string();
    Some((negative, digits, u32::try_from(scale).ok()?))
}

/// The integer digits and the fractional digits that matter (trailing zeros aside) of a parsed decimal: what a
/// column of precision P and scale S must have room for (`int ≤ P - S`, `frac ≤ S`).
pub fn digits_needed(digits: &str, scale: u32) -> (u32, u32) {
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    (
        int.trim_start_matches('0').len() as u32,
        frac.trim_end_matches('0').len() as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_read_and_write_as_their_exact_text() {
        assert_eq!(text(i256::from_i128(12345), 2), "123.45");
        assert_eq!(text(i256::from_i128(-5), 3), "-0.005");
        assert_eq!(text(i256::from_i128(7), 0), "7");
        assert_eq!(text(i256::from_i128(7), -2), "700");
        assert_eq!(parse("-12.3400"), Some((true, "123400".into(), 4)));
        assert_eq!(parse("1.5E+3"), Some((false, "1500".into(), 0)));
        assert_eq!(parse(".5"), Some((false, "5".into(), 1)));
        assert_eq!(parse("NaN"), None);
        assert_eq!(digits_needed("123400", 4), (2, 2));
        assert_eq!(digits_needed("5", 3), (0, 3));
    }
}
