"""A small inventory of parts for a bicycle workshop."""

from dataclasses import dataclass, field


@dataclass
class Part:
    name: str
    price: float
    quantity: int = 0
    tags: list[str] = field(default_factory=list)

    def value(self) -> float:
        return self.price * self.quantity


class Inventory:
    def __init__(self) -> None:
        self.parts: dict[str, Part] = {}

    def add(self, part: Part) -> None:
        if part.name in self.parts:
            self.parts[part.name].quantity += part.quantity
        else:
            self.parts[part.name] = part

    def remove(self, name: str, quantity: int) -> bool:
        part = self.parts.get(name)
        if part is None or part.quantity < quantity:
            return False
        part.quantity -= quantity
        return True

    def total_value(self) -> float:
        total = 0.0
        for part in self.parts.values():
            total += part.value()
        return total

    def tagged(self, tag: str) -> list[Part]:
        return [part for part in self.parts.values() if tag in part.tags]

    def low_stock(self, threshold: int = 3) -> list[str]:
        names = []
        for name, part in sorted(self.parts.items()):
            if part.quantity <= threshold:
                names.append(name)
        return names


if __name__ == "__main__":
    shop = Inventory()
    shop.add(Part("chain", 24.5, 10, ["drivetrain"]))
    shop.add(Part("brake pads", 8.0, 2, ["brakes"]))
    shop.add(Part("inner tube", 6.25, 30, ["wheels"]))
    print(shop.total_value())
    print(shop.low_stock())
