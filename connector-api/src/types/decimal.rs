//! Decimal numbers as exact text, shared by every decoder and sink that reads or writes decimals as digits.

use arrow_buffer::i256;

/// A decimal's exact text: `unscaled` × 10^-`scale` (`-12.3400`); a negative scale multiplies.
pub fn text(unscaled: i256, scale: i8) -> String {
    let (negative, digits) = magnitude(unscaled);
    let sign = if negative { "-" } else { "" };
    if scale <= 0 {
        let zeros = "0".repeat(usize::from(scale.unsigned_abs()));
        return match digits.as_str() {
            "0" => "0".to_string(),
            _ => format!("{sign}{digits}{zeros}"),
        };
    }
    let scale = scale as usize;
    let mut out = String::with_capacity(digits.len().max(scale + 1) + 2);
    out.push_str(sign);
    if digits.len() <= scale {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', scale - digits.len()));
        out.push_str(&digits);
    } else {
        let (int, frac) = digits.split_at(digits.len() - scale);
        out.push_str(int);
        out.push('.');
        out.push_str(frac);
    }
    out
}

/// A decimal as [`parse`] gives it: its sign, its digits without leading zeros (none for zero) and its scale
/// (a negative scale's zeros appended to the digits), without going through text.
pub fn parts(unscaled: i256, scale: i8) -> (bool, String, u32) {
    let (negative, mut digits) = magnitude(unscaled);
    if digits == "0" {
        digits.clear();
    }
    if scale < 0 {
        if !digits.is_empty() {
            digits.extend(std::iter::repeat_n('0', usize::from(scale.unsigned_abs())));
        }
        return (negative, digits, 0);
    }
    (negative, digits, scale as u32)
}

/// The sign and the decimal digits of `v`'s magnitude; values that fit an `i128` (every `Decimal128`) without
/// `i256`'s slower formatting.
fn magnitude(v: i256) -> (bool, String) {
    match v.to_i128() {
        Some(v) => (v < 0, v.unsigned_abs().to_string()),
        None => {
            let text = v.to_string();
            match text.strip_prefix('-') {
                Some(digits) => (true, digits.to_string()),
                None => (false, text),
            }
        }
    }
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

/// The integer digits and the fractional digits that matter (trailing zeros aside) of a parsed decimal (`digits`
/// without leading zeros, as [`parse`] gives them): what a column of precision P and scale S must have room for
/// (`int ≤ P - S`, `frac ≤ S`).
pub fn digits_needed(digits: &str, scale: u32) -> (u32, u32) {
    let trailing_zeros = digits.bytes().rev().take_while(|b| *b == b'0').count() as u32;
    let int = (digits.len() as u32).saturating_sub(scale);
    let frac = match digits.is_empty() {
        true => 0,
        false => scale.saturating_sub(trailing_zeros),
    };
    (int, frac)
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
        assert_eq!(digits_needed("1000", 2), (2, 0));
        assert_eq!(digits_needed("", 2), (0, 0));
        let big = i256::from_i128(i128::MAX) * i256::from_i128(-1000);
        assert_eq!(text(big, 5), "-1701411834604692317316873037158841057.27000");
        assert_eq!(text(i256::from_i128(-5), 1), "-0.5");
        assert_eq!(text(i256::ZERO, 2), "0.00");
        assert_eq!(parts(i256::from_i128(-12340), 2), (true, "12340".into(), 2));
        assert_eq!(parts(i256::from_i128(7), -2), (false, "700".into(), 0));
        assert_eq!(parts(i256::ZERO, 3), (false, String::new(), 3));
        assert_eq!(
            parts(big, 0).1,
            "170141183460469231731687303715884105727000"
        );
    }
}
