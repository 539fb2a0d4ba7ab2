/* Force-included into mlx-c's C++ build on non-ARM targets.
 * mlx-c's half.h declares float16_t/bfloat16_t (and HAS_FLOAT16/HAS_BFLOAT16) on ARM only, so
 * the f16/bf16 accessors mlx-rs calls would vanish. They only copy 16-bit payloads, so 16-bit
 * unsigned storage types give the same ABI. */
#if !defined(__aarch64__) && !defined(MLX_SYS_HALF_COMPAT)
#define MLX_SYS_HALF_COMPAT
#include <stdint.h>
typedef uint16_t float16_t;
typedef uint16_t bfloat16_t;
#define HAS_FLOAT16
#define HAS_BFLOAT16
#endif
