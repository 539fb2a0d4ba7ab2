/* Force-included by bindgen on non-ARM targets (see half_cxx.h). libclang accepts `__fp16`
 * there, which bindgen turns into the `__BindgenFloat16(u16)` struct mlx-rs expects; mlx-rs
 * reads bfloat16_t as a plain u16. */
#if !defined(__aarch64__) && !defined(MLX_SYS_HALF_COMPAT)
#define MLX_SYS_HALF_COMPAT
#include <stdint.h>
typedef __fp16 float16_t;
typedef uint16_t bfloat16_t;
#define HAS_FLOAT16
#define HAS_BFLOAT16
#endif
